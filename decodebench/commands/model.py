"""``decodebench model fetch|upload|list``: real checkpoints, locally and on a server.

``fetch NAME`` downloads a registry model once into the local model cache and prints its folder
(a Hugging Face checkpoint with tokenizer and chat template, what ``decodebench build --weights
DIR`` takes). ``upload DIR|FILE --name N`` sends a Hugging Face folder, a ``.gguf`` file or a
``.mlpackage`` (folder or zip) to a server in resumable chunks and registers it as model N; run
it again after an interruption to resume. A sweep then names it as ``upload:N`` (a checkpoint)
or in a variant's ``package`` field (a package). ``list`` prints the server's models.
Exit status 0, or 2 on error.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from decodebench.commands.common import CliError, add_server_options, client

UPLOAD_TIMEOUT_S = 300.0


def register(subparsers: Any) -> None:
    from decodebench.building.realmodels import REGISTRY_MODELS

    parser = subparsers.add_parser(
        "model",
        help="fetch real checkpoints, upload your own to a server",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = parser.add_subparsers(dest="action", required=True)
    fetch = actions.add_parser("fetch", help="download and convert a model (cached)")
    fetch.add_argument("name", choices=sorted(REGISTRY_MODELS))
    fetch.add_argument("--cache", default=None, help="cache folder (or DECODEBENCH_MODEL_CACHE)")
    fetch.set_defaults(handler=cmd_fetch)
    upload = actions.add_parser("upload", help="upload a checkpoint, GGUF or .mlpackage")
    upload.add_argument("source", metavar="DIR|FILE")
    upload.add_argument("--name", required=True, help="the model's name on the server")
    upload.add_argument("--chunk-mib", type=int, default=8, help="bytes per request, in MiB")
    upload.set_defaults(handler=cmd_upload)
    listing = actions.add_parser("list", help="list the server's models")
    listing.set_defaults(handler=cmd_list)
    for action in (upload, listing):
        add_server_options(action)


def cmd_fetch(args: argparse.Namespace) -> int:
    from pathlib import Path

    from decodebench.building.realmodels import FetchError, fetch_model

    def log(message: str) -> None:
        print(f"  {message}", file=sys.stderr, flush=True)

    try:
        folder = fetch_model(args.name, Path(args.cache) if args.cache else None, log)
    except FetchError as error:
        print(f"decodebench model fetch: error: {error}", file=sys.stderr)
        return 2
    print(folder)
    return 0


def cmd_upload(args: argparse.Namespace) -> int:
    from pathlib import Path

    import httpx

    from decodebench.client import ApiError
    from decodebench.modelfiles import ModelFileError
    from decodebench.uploading import UploadError, upload_model

    shown: dict[str, int] = {}

    def progress(name: str, offset: int, size: int) -> None:
        percent = offset * 100 // size
        if shown.get(name) != percent:
            shown[name] = percent
            print(f"  {name}: {percent}% ({offset:,} of {size:,} bytes)", file=sys.stderr)

    def log(message: str) -> None:
        print(f"  {message}", file=sys.stderr, flush=True)

    if args.chunk_mib < 1:
        print("decodebench model upload: error: --chunk-mib must be at least 1", file=sys.stderr)
        return 2
    try:
        with client(args, timeout=UPLOAD_TIMEOUT_S) as server:
            model = upload_model(
                server, Path(args.source), args.name,
                chunk_bytes=args.chunk_mib * 2**20, progress=progress, log=log,
            )  # fmt: skip
    except (
        CliError,
        ValueError,
        ModelFileError,
        UploadError,
        ApiError,
        httpx.TransportError,
    ) as error:
        print(f"decodebench model upload: error: {error}", file=sys.stderr)
        return 2
    print(
        f"{model.name}: {_kind_text(model)}, {model.architecture or 'architecture not read'}, "
        f"{model.total_bytes:,} bytes, content {model.content_sha256[:16]}"
    )
    return 0


def _kind_text(model: Any) -> str:
    """``coreml package`` for a package, the kind alone for a checkpoint."""
    if model.format is not None:
        return f"{model.format.value} {model.kind.value}"
    return model.kind.value


def cmd_list(args: argparse.Namespace) -> int:
    import httpx

    from decodebench.client import ApiError

    try:
        with client(args, timeout=UPLOAD_TIMEOUT_S) as server:
            models = server.list_models()
    except (CliError, ValueError, ApiError, httpx.TransportError) as error:
        print(f"decodebench model list: error: {error}", file=sys.stderr)
        return 2
    for model in models:
        print(
            f"{model.name:<32} {_kind_text(model):<16} {model.architecture or '-':<20} "
            f"{model.total_bytes:>14,} B  {model.content_sha256[:16]}"
        )
    return 0
