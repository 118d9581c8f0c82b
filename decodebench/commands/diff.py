"""``decodebench diff A.mlpackage B.mlpackage``: why one build should decode faster than another.

Prints the bytes moved per token by category for both, the ops added and removed by type, the
redundant copies only one of them makes, and the speed-up of B over A (from the bytes alone,
and per device profile). Exit status 0, or 2 when a path cannot be analysed.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "diff",
        help="compare the graphs of two saved .mlpackage builds",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("a", metavar="A.mlpackage")
    parser.add_argument("b", metavar="B.mlpackage")
    parser.add_argument("--json", action="store_true", help="print the diff as one JSON object")
    parser.set_defaults(handler=cmd_diff)


def cmd_diff(args: argparse.Namespace) -> int:
    from decodebench.analysis.analyze import AnalysisError, analyze_mlpackage
    from decodebench.analysis.diff import diff_analyses, render_diff

    try:
        a, b = analyze_mlpackage(args.a), analyze_mlpackage(args.b)
    except AnalysisError as error:
        print(f"decodebench diff: error: {error}", file=sys.stderr)
        return 2
    diff = diff_analyses(a, b, labels=(args.a, args.b))
    if args.json:
        print(json.dumps(diff.model_dump(mode="json"), indent=2))
    else:
        print(render_diff(diff))
    return 0
