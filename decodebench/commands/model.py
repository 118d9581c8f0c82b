"""``decodebench model fetch NAME``: download a real checkpoint once and print its folder.

The folder (a Hugging Face checkpoint with tokenizer and chat template) is what
``decodebench build --weights DIR`` takes. Exit status 0 with the folder printed, 2 on error.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any


def register(subparsers: Any) -> None:
    from decodebench.realmodels import REGISTRY_MODELS

    parser = subparsers.add_parser(
        "model",
        help="fetch real checkpoints into the local model cache",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = parser.add_subparsers(dest="action", required=True)
    fetch = actions.add_parser("fetch", help="download and convert a model (cached)")
    fetch.add_argument("name", choices=sorted(REGISTRY_MODELS))
    fetch.add_argument("--cache", default=None, help="cache folder (or DECODEBENCH_MODEL_CACHE)")
    fetch.set_defaults(handler=cmd_fetch)


def cmd_fetch(args: argparse.Namespace) -> int:
    from pathlib import Path

    from decodebench.realmodels import FetchError, fetch_model

    def log(message: str) -> None:
        print(f"  {message}", file=sys.stderr, flush=True)

    try:
        folder = fetch_model(args.name, Path(args.cache) if args.cache else None, log)
    except FetchError as error:
        print(f"decodebench model fetch: error: {error}", file=sys.stderr)
        return 2
    print(folder)
    return 0
