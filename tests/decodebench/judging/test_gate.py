"""The CI gate's renderers (JUnit XML, markdown, JSON) and its exit-code policy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from junitparser import Failure, JUnitXml

from decodebench.contracts.verdicts import Metric
from decodebench.judging.gate import (
    ExitCode,
    GateReport,
    exit_code,
    gate,
    render_json,
    render_junit,
    render_markdown,
)
from decodebench.judging.verdicts import judge_sweep
from tests.support.judging import arm


@pytest.fixture(scope="module")
def rows():
    tokens = {p: [1, 2, 3, 4] for p in range(30)}
    return judge_sweep(
        [
            arm("base", run_spread=0.01, seed=1, tokens=tokens),
            arm("fast", speed=1.2, ttft=0.9, run_spread=0.01, seed=2, tokens=tokens),
            arm("slow", speed=0.9, run_spread=0.01, seed=3, tokens={**tokens, 4: [1, 9, 9, 9]}),
        ]
    )


def test_exit_codes(rows) -> None:
    assert exit_code(gate(rows[:1])) == ExitCode.passed == 0
    assert exit_code(gate(rows)) == ExitCode.regression == 1
    assert exit_code(gate(rows, fail_on_regression=False)) == 0
    assert exit_code(gate(rows[1:], gated_metrics=(Metric.peak_memory_bytes,))) == 0
    assert exit_code(gate(rows, error="baseline sweep 7 is of another model")) == 2
    assert exit_code(gate([], timed_out=True)) == 3
    assert exit_code(gate(rows, error="bad", timed_out=True)) == 2


def test_junit_is_read_by_a_junit_parser_with_one_case_per_variant_and_device(
    rows, tmp_path: Path
) -> None:
    path = tmp_path / "decodebench.xml"
    path.write_text(render_junit(gate(rows)))

    xml = JUnitXml.fromfile(str(path))
    [suite] = list(xml)
    cases = {case.name: case for case in suite}
    assert sorted(cases) == ["fast vs base", "slow vs base"]
    assert suite.tests == 2 and suite.failures == 1
    assert cases["fast vs base"].is_passed
    [failure] = cases["slow vs base"].result
    assert isinstance(failure, Failure)
    assert "decode tok/s" in failure.message and "slower" in failure.message
    assert "x [" in failure.message  # the interval travels with the verdict
    assert cases["slow vs base"].classname == "decodebench.iphone-17-pro"


def test_junit_reports_an_error_or_time_out_as_an_error_case(tmp_path: Path) -> None:
    path = tmp_path / "timeout.xml"
    path.write_text(render_junit(gate([], timed_out=True)))

    [suite] = list(JUnitXml.fromfile(str(path)))
    [case] = list(suite)
    assert suite.errors == 1 and case.result[0].type == "timeout"


def test_markdown_table_for_a_pull_request(rows) -> None:
    text = render_markdown(gate(rows))
    lines = text.splitlines()

    assert lines[0].startswith("**decodebench: REGRESSION**")
    header = lines.index(
        "| device class | variant vs baseline | decode tok/s | TTFT | peak memory | outputs |"
    )
    table = lines[header + 2 : header + 4]
    assert table[0].startswith("| iphone-17-pro | fast vs base | 1.1")  # 1.2 x a run offset
    assert "faster" in table[0] and "identical (30 prompts)" in table[0]
    assert "slower" in table[1] and "1 diverge (first at token 1.0" in table[1]
    assert all(line.count("|") == 7 for line in table)
    assert "95% bootstrap intervals" in text


def test_json_round_trips(rows) -> None:
    text = render_json(gate(rows))

    report = GateReport.model_validate_json(text)
    assert report.exit_code == 1 and len(report.rows) == 2
    assert json.loads(text)["rows"][1]["decode_tok_s"]["label"] == "slower"
    assert report.regressions[0].startswith("slow on iphone-17-pro: decode tok/s slower")
