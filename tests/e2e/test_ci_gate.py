"""The CI gate end to end: `decodebench submit … --fail-on-regression` against a real server,
with a stand-in worker and agent acting over HTTP. Exit 0 pass, 1 regression, 2 error or bad
input, 3 timed out; the JUnit file reads back with a JUnit parser."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from junitparser import JUnitXml

from decodebench.cli import main
from scripts.stack import Stack
from tests.support.api import bearer
from tests.support.stand_ins import StandIns

SPEC = {
    "model": "tiny-gqa",
    "variants": [{"attention": "repeat_kv"}, {"attention": "folded"}],
    "devices": ["iphone-17-pro"],
    "prompts": 8,
    "decode_tokens": 4,
    "repetitions": 2,
}


def _gate(stack: Stack, tmp_path: Path, *options: str, spec: dict = SPEC) -> int:
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(spec))
    return main(["submit", "--server", stack.server_url, "--token", stack.tokens["user"],
                 "--spec", str(spec_file), "--timeout", "60", *options])  # fmt: skip


@pytest.mark.parametrize(("folded_speed", "code"), [(0.90, 1), (1.0, 0), (1.3, 0)])
def test_the_gate_fails_only_on_a_significant_slowdown(
    stack: Stack, tmp_path: Path, folded_speed: float, code: int, capsys
) -> None:
    stand_ins = StandIns(stack, folded_speed)
    stand_ins.start()
    try:
        junit, markdown = tmp_path / "gate.xml", tmp_path / "gate.md"
        exit_code = _gate(stack, tmp_path, "--baseline", "variant:repeat_kv-ctx512-fp16",
                          "--fail-on-regression", "2%", "--junit", str(junit), "--markdown", str(markdown))  # fmt: skip
    finally:
        stand_ins.stopped.set()
        stand_ins.join(timeout=10)
    assert exit_code == code
    cases = [case for suite in JUnitXml.fromfile(str(junit)) for case in suite]
    assert len(cases) == 1  # one variant x one device class
    assert bool(cases[0].result) == (code == 1)
    table = markdown.read_text()
    assert "folded-ctx512-fp16" in table and "iphone-17-pro" in table
    expected = {0.90: "slower", 1.0: "no significant change", 1.3: "faster"}[folded_speed]
    assert expected in table


def test_bad_gate_input_exits_2_and_writes_nothing(stack: Stack, tmp_path: Path) -> None:
    assert _gate(stack, tmp_path, "--fail-on-regression", "70%") == 2
    assert _gate(stack, tmp_path, "--baseline", "variant:no-such-variant") == 2
    assert (
        httpx.get(f"{stack.server_url}/api/v1/sweeps", headers=bearer(stack.tokens["user"])).json()
        == []
    )


def test_a_baseline_sweep_of_another_model_is_refused(stack: Stack, tmp_path: Path) -> None:
    user = bearer(stack.tokens["user"])
    other = {**SPEC, "model": "tiny-llama"}
    earlier = httpx.post(f"{stack.server_url}/api/v1/sweeps", json=other, headers=user).json()
    this = httpx.post(f"{stack.server_url}/api/v1/sweeps", json=SPEC, headers=user).json()
    refused = httpx.get(f"{stack.server_url}/api/v1/sweeps/{this['id']}/verdicts",
                        params={"baseline_sweep": earlier["id"]}, headers=user)  # fmt: skip
    assert refused.status_code == 422 and "measured tiny-llama" in refused.text


def test_the_gate_times_out_with_exit_3(stack: Stack, tmp_path: Path) -> None:
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(SPEC))
    code = main(["submit", "--server", stack.server_url, "--token", stack.tokens["user"],
                 "--spec", str(spec_file), "--timeout", "1", "--fail-on-regression"])  # fmt: skip
    assert code == 3
