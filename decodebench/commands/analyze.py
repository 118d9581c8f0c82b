"""``decodebench analyze PATH.mlpackage``: what a saved build's graph moves per decoded token.

Reads the program with coremltools (no device needed) and prints its op counts, tile and
state-write ops, weight bytes by encoding, and the bytes moved per token by category (weights,
KV cache reads and writes, redundant copies), then the avoidable bytes it recognises: each with
its bytes per token, its fix, whether ``decodebench repair`` applies it, and the predicted tok/s
per device class after it. Exit status 0, or 2 when it cannot be analysed.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from decodebench.commands.common import CliError


def register(subparsers: Any) -> None:
    analyze = subparsers.add_parser(
        "analyze",
        help="analyse the graph of a saved .mlpackage",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    analyze.add_argument("path")
    analyze.add_argument("--json", action="store_true", help="print one JSON object")
    analyze.set_defaults(handler=cmd_analyze)


def cmd_analyze(args: argparse.Namespace) -> int:
    from decodebench.analysis.analyze import (
        AnalysisError,
        analyze_graphs,
        format_of,
        render_analysis,
    )
    from decodebench.doctor.waste import find_waste
    from decodebench.doctor.waste import render as render_waste
    from decodebench.formats import get_format

    try:
        analysis, graphs = analyze_graphs(Path(args.path))
    except AnalysisError as error:
        raise CliError(str(error)) from None
    waste = find_waste(Path(args.path), analysis, graphs)
    faults = get_format(format_of(args.path)).known_faults(graphs)
    if args.json:
        payload = analysis.model_dump(mode="json")
        payload["waste"] = [item.model_dump(mode="json") for item in waste]
        payload["known_faults"] = faults
        print(json.dumps(payload, indent=2, sort_keys=True))
        return 0
    waste_lines = [f"  {line}" for line in render_waste(waste, analysis)]
    waste_lines += [f"  known fault on phones: {fault}" for fault in faults]
    print(render_analysis(analysis, str(args.path), waste_lines))
    return 0
