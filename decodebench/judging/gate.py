"""The CI gate: verdict rows rendered as JUnit XML, a markdown table and JSON, and the exit code.

Exit codes: 0 pass, 1 regression (a gated metric judged worse), 2 error or bad input, 3 timed out.
A regression is judged by the verdict rule (interval excludes 1 and the ratio clears the minimum
effect, docs/statistics.md); output divergence is reported, never gated on.
"""

from __future__ import annotations

import xml.etree.ElementTree as ElementTree
from collections.abc import Sequence
from enum import IntEnum

from pydantic import BaseModel, ConfigDict, Field

from decodebench.contracts.verdicts import Metric, MetricComparison, OutputAgreement, VariantVerdict

DEFAULT_GATED = (Metric.decode_tok_s, Metric.ttft_ms)
_METRIC_TITLES = {
    Metric.decode_tok_s: "decode tok/s",
    Metric.ttft_ms: "TTFT",
    Metric.peak_memory_bytes: "peak memory",
}


class ExitCode(IntEnum):
    passed = 0
    regression = 1
    error = 2
    timed_out = 3


class GateReport(BaseModel):
    """What `--json` prints: the outcome, its exit code and every judged row."""

    model_config = ConfigDict(frozen=True)

    outcome: ExitCode
    exit_code: int
    reason: str
    fail_on_regression: bool
    gated_metrics: tuple[Metric, ...]
    regressions: tuple[str, ...] = Field(description="'variant on device: metric slower …'")
    rows: tuple[VariantVerdict, ...]


def _regression_lines(rows: Sequence[VariantVerdict], gated: Sequence[Metric]) -> list[str]:
    return [
        f"{row.variant} on {row.device_class}: {_METRIC_TITLES[c.metric]} {c.label} "
        f"{c.interval_text()} vs {row.baseline}"
        for row in rows
        for c in row.regressions(tuple(gated))
    ]


def gate(
    rows: Sequence[VariantVerdict],
    *,
    fail_on_regression: bool = True,
    gated_metrics: Sequence[Metric] = DEFAULT_GATED,
    error: str | None = None,
    timed_out: bool = False,
) -> GateReport:
    """The gate's decision. An error wins over a time-out, a time-out over any verdict."""
    regressions = tuple(_regression_lines(rows, gated_metrics))
    if error is not None:
        outcome, reason = ExitCode.error, error
    elif timed_out:
        outcome, reason = ExitCode.timed_out, "timed out before the sweep finished"
    elif regressions and fail_on_regression:
        outcome, reason = ExitCode.regression, f"{len(regressions)} regression(s)"
    else:
        noted = f"; {len(regressions)} regression(s) not gated" if regressions else ""
        outcome, reason = ExitCode.passed, f"{len(rows)} comparison(s) judged{noted}"
    return GateReport(
        outcome=outcome,
        exit_code=int(outcome),
        reason=reason,
        fail_on_regression=fail_on_regression,
        gated_metrics=tuple(gated_metrics),
        regressions=regressions,
        rows=tuple(rows),
    )


def exit_code(report: GateReport) -> int:
    return int(report.outcome)


def _agreement_text(agreement: OutputAgreement | None) -> str:
    if agreement is None:
        return "tokens not recorded"
    if agreement.identical:
        return f"identical ({agreement.prompts_compared} prompts)"
    return (
        f"{agreement.identical_share:.0%} identical; {len(agreement.diverging_prompts)} diverge "
        f"(first at token {agreement.mean_first_divergence:.1f} on average)"
    )


def _cell(comparison: MetricComparison) -> str:
    return f"{comparison.interval_text()} {comparison.label}"


def render_markdown(report: GateReport) -> str:
    """A table for a pull-request comment, one row per variant × device class."""
    verdict_word = {0: "pass", 1: "REGRESSION", 2: "error", 3: "timed out"}[report.exit_code]
    lines = [
        f"**decodebench: {verdict_word}** — {report.reason}",
        "",
        "| device class | variant vs baseline | decode tok/s | TTFT | peak memory | outputs |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for row in report.rows:
        cells = [
            row.device_class,
            f"{row.variant} vs {row.baseline}",
            *(_cell(c) for c in row.comparisons()),
            _agreement_text(row.agreement),
        ]
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    if report.rows:
        first = report.rows[0].decode_tok_s
        lines += [
            "",
            f"Ratios are variant / baseline means with {first.confidence_level:.0%} bootstrap "
            f"intervals; a change counts when the interval excludes 1 and it is at least "
            f"{first.min_effect:.0%}.",
        ]
    return "\n".join(lines) + "\n"


def render_junit(report: GateReport, suite: str = "decodebench") -> str:
    """JUnit XML: one test case per variant × device class; a gated regression is a failure,
    an error or a time-out is one <error> test case."""
    suites = ElementTree.Element("testsuites", name=suite)
    cases = ElementTree.SubElement(suites, "testsuite", name=suite)
    failures = errors = 0
    for row in report.rows:
        case = ElementTree.SubElement(
            cases,
            "testcase",
            classname=f"{suite}.{row.device_class}",
            name=f"{row.variant} vs {row.baseline}",
        )
        detail = "\n".join(
            [
                *(f"{_METRIC_TITLES[c.metric]}: {_cell(c)}" for c in row.comparisons()),
                f"outputs: {_agreement_text(row.agreement)}",
                *row.notes,
            ]
        )
        regressed = row.regressions(report.gated_metrics)
        if regressed and report.fail_on_regression:
            failures += 1
            message = "; ".join(f"{_METRIC_TITLES[c.metric]} {_cell(c)}" for c in regressed)
            failure = ElementTree.SubElement(case, "failure", message=message, type="regression")
            failure.text = detail
        ElementTree.SubElement(case, "system-out").text = detail
    if report.outcome in (ExitCode.error, ExitCode.timed_out):
        errors += 1
        case = ElementTree.SubElement(cases, "testcase", classname=suite, name="sweep")
        kind = "timeout" if report.outcome is ExitCode.timed_out else "error"
        ElementTree.SubElement(case, "error", message=report.reason, type=kind)
    total = len(report.rows) + errors
    for element in (suites, cases):
        element.set("tests", str(total))
        element.set("failures", str(failures))
        element.set("errors", str(errors))
    return ElementTree.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"


def render_json(report: GateReport) -> str:
    return report.model_dump_json(indent=2) + "\n"
