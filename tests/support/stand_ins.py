"""A stand-in build worker and agent acting over HTTP on a real server process."""

from __future__ import annotations

import hashlib
import random
import threading

import httpx

from scripts.stack import Stack
from scripts.standins import build_report, full_analysis
from tests.support.api import bearer

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
