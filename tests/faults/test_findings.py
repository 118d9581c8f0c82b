"""Against a server process of its own: a build is reported on only by its lease holder, with a
report that validates; 50 devices uploading at once neither fail nor stall the server; the
results of a run that has ended cannot be rewritten."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from scripts.stack import Stack
from scripts.standins import build_report
from tests.support.api import bearer, complete_build, start_and_complete
from tests.support.services import table_counts
from tests.support.sweeps import DEVICE, SWEEP, analysis, finish_builds, result_for

UPLOADERS = 50


def test_another_worker_cannot_complete_a_build_and_a_bad_report_jams_no_queue(
    stack: Stack,
) -> None:
    tokens = stack.tokens
    with httpx.Client(base_url=stack.server_url, timeout=30) as api:
        sweep = api.post("/api/v1/sweeps", json=SWEEP, headers=bearer(tokens["user"])).json()
        held, other = sweep["builds"]
        worker = bearer(tokens["worker"])
        started = api.post(f"/api/v1/builds/{held['id']}/start", json={"worker": "w1"},
                           headers=worker).json()  # fmt: skip
        assert started["proceed"]
        # a second worker, with another build's artifact and a made-up lease
        forged = {"lease": "0" * 32, "artifact_sha256": "a" * 64,
                  "report": build_report(held, {"hello": "world"})}  # fmt: skip
        refused = api.post(f"/api/v1/builds/{held['id']}/complete", json=forged, headers=worker)
        assert refused.status_code in {409, 422}, refused.text
        assert (
            api.get(f"/api/v1/builds/{held['id']}", headers=bearer(tokens["user"])).json()["state"]
            == "building"
        )
        # the other build's own worker sends a report that does not validate
        bad = start_and_complete(api, other, tokens["worker"], build_report(other, {"a": 1}))
        assert bad.status_code == 422, bad.text
        assert (
            api.get(f"/api/v1/sweeps/{sweep['id']}", headers=bearer(tokens["user"])).status_code
            == 200
        )
        api.post("/api/v1/agents/register", json={"name": "h", "devices": [DEVICE]},
                 headers=bearer(tokens["agent"])).raise_for_status()  # fmt: skip
        claim = api.post("/api/v1/agents/claim", json={"device_udid": DEVICE["udid"]},
                         headers=bearer(tokens["agent"]))  # fmt: skip
        assert claim.status_code == 200 and claim.json() == {"run": None}


def test_fifty_devices_uploading_at_once_neither_fail_nor_stall_the_server(stack: Stack) -> None:
    """Once 30 of 50 concurrent uploads got 500 and /health took 29 s (the pool ran dry)."""
    tokens = stack.tokens
    agent = bearer(tokens["agent"])
    devices = [{**DEVICE, "udid": f"SIM-{index:04d}"} for index in range(UPLOADERS)]
    with httpx.Client(base_url=stack.server_url, timeout=30) as api:
        variants = [{"attention": "folded", "context": 128 + 64 * i} for i in range(5)]
        spec = {**SWEEP, "variants": variants, "repetitions": UPLOADERS // len(variants)}
        sweep = api.post("/api/v1/sweeps", json=spec, headers=bearer(tokens["user"])).json()
        for build in sweep["builds"]:
            complete_build(api, build, tokens["worker"], analysis(0, 1_000_000))
        api.post("/api/v1/agents/register", json={"name": "h", "devices": devices},
                 headers=agent).raise_for_status()  # fmt: skip
        runs = []
        for device in devices:
            claim = api.post("/api/v1/agents/claim", json={"device_udid": device["udid"]},
                             headers=agent).json()  # fmt: skip
            runs.append((claim["run"]["run_id"], device["udid"]))

    async def scenario() -> tuple[list[int], list[float]]:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        async with httpx.AsyncClient(base_url=stack.server_url, timeout=60, limits=limits) as c:
            done = asyncio.Event()
            health_s: list[float] = []

            async def probe() -> None:
                while not done.is_set():
                    started = time.monotonic()
                    assert (await c.get("/api/v1/health")).status_code == 200
                    health_s.append(time.monotonic() - started)
                    await asyncio.sleep(0.02)

            async def upload(run_id: int, udid: str) -> int:
                result = result_for(range(SWEEP["prompts"]), 10.0, udid=udid)
                answer = await c.post(f"/api/v1/runs/{run_id}/results", json=result, headers=agent)
                return answer.status_code

            prober = asyncio.create_task(probe())
            await asyncio.sleep(0.05)
            statuses = await asyncio.gather(*(upload(*run) for run in runs))
            done.set()
            await prober
            return list(statuses), health_s

    statuses, health_s = asyncio.run(scenario())
    assert statuses == [200] * UPLOADERS
    assert health_s and max(health_s) < 2.0, max(health_s)  # not the 29 s of a dry pool
    assert table_counts()["prompt_results"] == UPLOADERS * SWEEP["prompts"]


def test_the_results_of_an_ended_run_cannot_be_rewritten(stack: Stack) -> None:
    tokens = stack.tokens
    agent = bearer(tokens["agent"])
    with httpx.Client(base_url=stack.server_url, timeout=30) as api:
        sweep = api.post("/api/v1/sweeps", json=SWEEP, headers=bearer(tokens["user"])).json()
        finish_builds(api, sweep, tokens["worker"])
        api.post("/api/v1/agents/register", json={"name": "h", "devices": [DEVICE]},
                 headers=agent).raise_for_status()  # fmt: skip
        run_id = api.post("/api/v1/agents/claim", json={"device_udid": DEVICE["udid"]},
                          headers=agent).json()["run"]["run_id"]  # fmt: skip
        path = f"/api/v1/runs/{run_id}/results"
        result = result_for(range(SWEEP["prompts"]), 10.0)
        assert api.post(path, json=result, headers=agent).json()["state"] == "succeeded"
        again = api.post(path, json=result, headers=agent)  # its answer lost on the wire
        assert again.status_code == 200 and again.json()["state"] == "succeeded"
        rewritten = api.post(path, json=result_for(range(1), 99_999.0), headers=agent)
        assert rewritten.status_code == 409 and "immutable" in rewritten.text
        detail = api.get(f"/api/v1/sweeps/{sweep['id']}", headers=bearer(tokens["user"])).json()
    stored = next(run for run in detail["runs"] if run["id"] == run_id)
    assert stored["summary"]["decode_tok_s"]["mean"] == pytest.approx(11.0)
    assert table_counts()["prompt_results"] == SWEEP["prompts"]
