"""The CI gate end to end: `decodebench submit … --fail-on-regression` against a real server,
with a stand-in worker and agent acting over HTTP. Exit 0 pass, 1 regression, 2 error or bad
input, 3 timed out; the JUnit file reads back with a JUnit parser."""

from __future__ import annotations

import json
import random
import threading
from pathlib import Path

import httpx
import pytest
from junitparser import JUnitXml

from decodebench.cli import main
from scripts.stack import Stack
from tests.conftest import bearer, build_report, full_analysis

SPEC = {
    "model": "tiny-gqa",
    "variants": [{"attention": "repeat_kv"}, {"attention": "folded"}],
    "devices": ["iphone-17-pro"],
    "prompts": 8,
    "decode_tokens": 4,
    "repetitions": 2,
}
DEVICE = {"udid": "GATE-1", "device_class": "iphone-17-pro", "product_type": "iPhone18,1",
          "driver": "simulated", "simulated": True}  # fmt: skip


class StandIns(threading.Thread):
    """Completes every build and run it finds, folded at ``folded_speed`` x repeat_kv's rate."""

    def __init__(self, stack: Stack, folded_speed: float) -> None:
        super().__init__(daemon=True)
        self.stack, self.folded_speed = stack, folded_speed
        self.stopped = threading.Event()
        self.random = random.Random(7)

    def run(self) -> None:
        url, tokens = self.stack.server_url, self.stack.tokens
        with httpx.Client(base_url=url, timeout=30) as http:
            http.post("/api/v1/agents/register", json={"name": "gate", "devices": [DEVICE]},
                      headers=bearer(tokens["agent"]))  # fmt: skip
            while not self.stopped.wait(0.2):
                for sweep in http.get("/api/v1/sweeps", headers=bearer(tokens["user"])).json():
                    detail = http.get(
                        f"/api/v1/sweeps/{sweep['id']}", headers=bearer(tokens["user"])
                    ).json()
                    for build in detail["builds"]:
                        if build["state"] == "queued":
                            self._build(http, build)
                self._run(http)

    def _build(self, http: httpx.Client, build: dict) -> None:
        worker = bearer(self.stack.tokens["worker"])
        start = http.post(
            f"/api/v1/builds/{build['id']}/start", json={"worker": "w"}, headers=worker
        ).json()
        if not start["proceed"]:
            return
        payload = build["key"].encode()
        import hashlib

        sha = hashlib.sha256(payload).hexdigest()
        http.put(f"/api/v1/artifacts/{sha}", content=payload, headers=worker)
        report = build_report(build, full_analysis({"bytes_per_token": {"total": 1_000_000}}))
        http.post(f"/api/v1/builds/{build['id']}/complete",
                  json={"lease": start["lease"], "artifact_sha256": sha, "report": report}, headers=worker)  # fmt: skip

    def _run(self, http: httpx.Client) -> None:
        agent = bearer(self.stack.tokens["agent"])
        claim = http.post(
            "/api/v1/agents/claim", json={"device_udid": DEVICE["udid"]}, headers=agent
        ).json()
        run = claim["run"]
        if run is None:
            return
        base = 1000.0 * (self.folded_speed if run["variant"]["attention"] == "folded" else 1.0)
        prompts = []
        for index in range(run["prompts"]):
            rate = base * self.random.gauss(1.0, 0.01)
            prompts.append({"prompt_index": index, "prompt_tokens": 5, "generated_tokens": 4,
                            "ttft_ms": 5.0, "prefill_tok_s": 100.0, "decode_tok_s": rate,
                            "token_latencies_ms": [1000 / rate] * 4, "token_ids": [1, 2, 3, index]})  # fmt: skip
        result = {**{k: DEVICE[k] for k in ("device_class", "product_type", "driver", "simulated")},
                  "device_udid": DEVICE["udid"], "load_time_cold_ms": 1.0, "load_time_warm_ms": 1.0,
                  "peak_memory_bytes": 1000, "timing_model": "stand-in", "prompts": prompts}  # fmt: skip
        http.post(f"/api/v1/runs/{run['run_id']}/results", json=result, headers=agent)


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
