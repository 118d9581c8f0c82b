"""`decodebench submit … --baseline … --fail-on-regression`: the CI gate.

Exit 0 pass, 1 regression, 2 error or bad input, 3 timed out. The verdicts come from the server
(bootstrap intervals, decodebench.judging); this module only asks for them and renders them as
JUnit XML, a markdown table for a pull-request comment, and JSON.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from decodebench.contracts.verdicts import MAX_MIN_EFFECT, VariantVerdict
from decodebench.judging.gate import (
    GateReport,
    gate,
    render_json,
    render_junit,
    render_markdown,
)


class GateInputError(ValueError):
    """A gate option that cannot be used; the message names it."""


@dataclass(frozen=True)
class Baseline:
    variant: str | None = None  # a variant of the same sweep
    sweep_id: int | None = None  # an earlier sweep of the same model


def parse_baseline(text: str) -> Baseline:
    kind, _, value = text.partition(":")
    if not value:
        kind, value = ("sweep", text) if text.isdigit() else ("variant", text)
    if kind == "sweep" and value.isdigit() and int(value) > 0:
        return Baseline(sweep_id=int(value))
    if kind == "variant" and value:
        return Baseline(variant=value)
    if kind == "schedule":
        raise GateInputError(
            f"--baseline {text}: nightly schedules are not built yet; name the nightly's sweep "
            "(sweep:ID) instead"
        )
    raise GateInputError(f"--baseline {text}: give sweep:ID, variant:LABEL, or a sweep id")


def parse_min_effect(text: str) -> float:
    """``2%``, ``0.02`` or ``2`` (percent when above 1) -> 0.02."""
    try:
        value = float(text.rstrip("%"))
    except ValueError:
        raise GateInputError(f"--fail-on-regression {text}: not a number") from None
    if text.endswith("%") or value > 1:
        value /= 100
    if not 0 < value <= MAX_MIN_EFFECT:
        raise GateInputError(
            f"--fail-on-regression {text}: the minimum effect must be above 0% and at most "
            f"{MAX_MIN_EFFECT:.0%}"
        )
    return value


def add_gate_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--baseline",
        help="judge against: variant:LABEL (of this sweep) or sweep:ID (an earlier sweep of the "
        "same model, e.g. last night's); implies --wait",
    )
    parser.add_argument(
        "--fail-on-regression",
        nargs="?",
        const="",
        default=None,
        metavar="MIN_EFFECT",
        help="exit 1 when a variant is significantly slower (optionally: the minimum effect, "
        "e.g. 2%%; default the sweep's, 2%%); implies --wait",
    )
    parser.add_argument("--junit", type=Path, help="write a JUnit XML report here")
    parser.add_argument("--markdown", type=Path, help="write a markdown table here")
    parser.add_argument("--json", action="store_true", help="print the gate's report as JSON")


def gating(args: argparse.Namespace) -> bool:
    return bool(
        args.baseline
        or args.fail_on_regression is not None
        or args.junit
        or args.markdown
        or args.json
    )


def prepare_spec(spec: dict[str, Any], args: argparse.Namespace) -> tuple[Baseline, float | None]:
    """What the options change in the spec before it is submitted (validated by the server)."""
    baseline = parse_baseline(args.baseline) if args.baseline else Baseline()
    min_effect = parse_min_effect(args.fail_on_regression) if args.fail_on_regression else None
    if baseline.variant is not None:
        spec["baseline"] = baseline.variant
    # A pipeline is waiting on the verdict: its sweep goes ahead of nightly and ad hoc ones.
    spec.setdefault("priority", "ci")
    if min_effect is not None and baseline.sweep_id is None:
        spec["min_effect"] = min_effect
    return baseline, min_effect


def decide(
    rows: list[VariantVerdict],
    args: argparse.Namespace,
    *,
    error: str | None = None,
    timed_out: bool = False,
) -> GateReport:
    return gate(
        rows,
        fail_on_regression=args.fail_on_regression is not None,
        error=error,
        timed_out=timed_out,
    )


def publish(report: GateReport, args: argparse.Namespace) -> int:
    """Write the requested files, print the report, return the exit code."""
    if args.junit:
        args.junit.write_text(render_junit(report))
    if args.markdown:
        args.markdown.write_text(render_markdown(report))
    if args.json:
        print(render_json(report))
    else:
        print(render_markdown(report))
    return report.exit_code
