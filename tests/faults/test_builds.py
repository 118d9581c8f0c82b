"""A build belongs to the worker holding its lease; a killed worker's build is made again
without anyone stepping in; a bad report is refused before anything is stored."""

from __future__ import annotations

import os
import signal
import time

import httpx
from sqlalchemy import text

from scripts.stack import Stack
from scripts.standins import build_report, full_analysis
from server.db import get_engine
from tests.support.api import bearer, start_and_complete

SWEEP = {
    "model": "tiny-gqa",
    "variants": [{"attention": "folded", "context": 128}],
    "devices": ["iphone-17-pro"],
    "prompts": 2,
    "decode_tokens": 4,
}


def _build_state(api_url: str, token: str, build_id: int) -> dict:
    return httpx.get(
        f"{api_url}/api/v1/builds/{build_id}", headers=bearer(token), timeout=10
    ).json()


def test_only_the_lease_holder_may_report_on_a_build(api, user_token, worker_token) -> None:
    sweep = api.post("/api/v1/sweeps", json=SWEEP, headers=bearer(user_token)).json()
    build = sweep["builds"][0]
    headers = bearer(worker_token)
    first = api.post(f"/api/v1/builds/{build['id']}/start", json={"worker": "w1"}, headers=headers)
    assert first.json()["proceed"] and first.json()["lease"]
    # a second worker (or a duplicate message) does not get the build while the lease runs
    second = api.post(f"/api/v1/builds/{build['id']}/start", json={"worker": "w2"}, headers=headers)
    assert second.json() == {
        "proceed": False,
        "state": "building",
        "lease": None,
        "lease_seconds": None,
    }
    forged = {"lease": "0" * 32, "reason": "I did not build this"}
    refused = api.post(f"/api/v1/builds/{build['id']}/fail", json=forged, headers=headers)
    assert refused.status_code == 409 and "not held under this lease" in refused.text
    assert (
        api.get(f"/api/v1/builds/{build['id']}", headers=bearer(user_token)).json()["state"]
        == "building"
    )


def test_a_report_that_does_not_validate_stores_nothing_and_jams_nothing(
    api, user_token, worker_token, agent_token
) -> None:
    sweep = api.post("/api/v1/sweeps", json=SWEEP, headers=bearer(user_token)).json()
    build = sweep["builds"][0]
    hello = build_report(build, {"hello": "world"})
    refused = start_and_complete(api, build, worker_token, hello)
    assert refused.status_code == 422
    detail = api.get(f"/api/v1/builds/{build['id']}", headers=bearer(user_token))
    assert detail.status_code == 200 and detail.json()["report"] is None
    page = api.get(f"/api/v1/sweeps/{sweep['id']}", headers=bearer(user_token))
    assert page.status_code == 200
    device = {"udid": "SIM-1", "device_class": "iphone-17-pro", "product_type": "iPhone18,1",
              "driver": "simulated", "simulated": True}  # fmt: skip
    api.post(
        "/api/v1/agents/register",
        json={"name": "h", "devices": [device]},
        headers=bearer(agent_token),
    )
    claim = api.post(
        "/api/v1/agents/claim", json={"device_udid": "SIM-1"}, headers=bearer(agent_token)
    )
    assert claim.status_code == 200 and claim.json() == {"run": None}


def test_an_operator_can_fail_or_rebuild_a_succeeded_build(
    api, user_token, worker_token, admin_token
) -> None:
    sweep = api.post("/api/v1/sweeps", json=SWEEP, headers=bearer(user_token)).json()
    build = sweep["builds"][0]
    assert (
        start_and_complete(
            api, build, worker_token, build_report(build, full_analysis({}))
        ).status_code
        == 200
    )
    path = f"/api/v1/builds/{build['id']}"
    not_admin = api.post(
        f"{path}/rebuild", json={"reason": "bad artifact"}, headers=bearer(user_token)
    )
    assert not_admin.status_code == 403 and "admin scope" in not_admin.text
    rebuilt = api.post(
        f"{path}/rebuild", json={"reason": "bad artifact"}, headers=bearer(admin_token)
    )
    assert rebuilt.json() == {"state": "queued"}
    runs = api.get(f"/api/v1/sweeps/{sweep['id']}", headers=bearer(user_token)).json()["runs"]
    assert {run["state"] for run in runs} == {"waiting_build"}
    abandoned = api.post(f"{path}/abandon", json={"reason": "give up"}, headers=bearer(admin_token))
    assert abandoned.json() == {"state": "failed"}
    runs = api.get(f"/api/v1/sweeps/{sweep['id']}", headers=bearer(user_token)).json()["runs"]
    assert {run["state"] for run in runs} == {"failed"}
    assert "failed by operator: give up" in runs[0]["failure_reason"]


def test_a_killed_worker_s_build_is_rebuilt_by_another_without_a_human(stack: Stack) -> None:
    stack.stop()  # the fixture's server, restarted with a short build lease
    stack.processes.clear()
    stack.start_server(DECODEBENCH_BUILD_LEASE_SECONDS="3")
    doomed = stack.start_worker("worker-1")
    user = stack.tokens["user"]
    sweep = httpx.post(
        f"{stack.server_url}/api/v1/sweeps", json=SWEEP, headers=bearer(user), timeout=30
    ).json()
    build_id = sweep["builds"][0]["id"]
    deadline = time.monotonic() + 120
    while _build_state(stack.server_url, user, build_id)["state"] != "building":
        assert time.monotonic() < deadline, "the first worker never started the build"
        time.sleep(0.1)
    os.killpg(doomed.pid, signal.SIGKILL)
    doomed.wait(timeout=10)
    del stack.processes["worker-1"]
    stack.start_worker("worker-2")
    stack.start_beat(reconcile_interval_s=1.0)
    deadline = time.monotonic() + 240
    while (build := _build_state(stack.server_url, user, build_id))["state"] != "succeeded":
        assert build["state"] != "failed", build
        assert time.monotonic() < deadline, f"not rebuilt: {build}"
        stack.check_alive()
        time.sleep(0.5)
    assert build["attempts"] == 2
    with get_engine().connect() as connection:
        reasons = [
            row.reason
            for row in connection.execute(
                text(
                    "SELECT reason FROM transitions WHERE entity = 'build' AND entity_id = :id ORDER BY id"
                ),
                {"id": build_id},
            )
        ]
    assert any(
        "worker-1 stopped renewing its lease; queued again" in reason for reason in reasons
    ), reasons
    assert any("started by worker-2" in reason for reason in reasons), reasons
