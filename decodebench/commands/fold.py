"""``decodebench fold IN.mlpackage OUT.mlpackage``: remove GQA KV replication from a program.

Writes OUT with every provably exact attention pattern folded (K and V read at their stored
head count) and prints what was found, rewritten and refused, and the ops and bytes per token
before and after. Exit status 0 when OUT was written, 2 on error.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "fold",
        help="fold GQA KV replication out of a saved .mlpackage",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("source", metavar="IN.mlpackage")
    parser.add_argument("target", metavar="OUT.mlpackage")
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object")
    parser.set_defaults(handler=cmd_fold)


def cmd_fold(args: argparse.Namespace) -> int:
    from decodebench.analysis.analyze import AnalysisError
    from decodebench.formats.coreml.fold_package import fold_mlpackage, render
    from decodebench.formats.coreml.program import MilError, quiet_coremltools

    try:
        with quiet_coremltools():
            report = fold_mlpackage(args.source, args.target)
    except (MilError, AnalysisError) as error:
        print(f"decodebench fold: error: {error}", file=sys.stderr)
        if args.json:
            print(json.dumps({"error": str(error)}))
        return 2
    if args.json:
        payload = report.model_dump(mode="json")
        payload["found"], payload["rewritten"], payload["refused"] = (
            report.fold.found,
            report.fold.rewritten,
            report.fold.refused,
        )
        print(json.dumps(payload, indent=2))
    else:
        print(render(report))
    return 0
