"""A server outage longer than a minute — longer than the lease and than any upload retry —
loses no finished result, duplicates none and makes no run run twice."""

from __future__ import annotations

import hashlib
import io
import json
import os
import signal
import time
import zipfile

import httpx
from sqlalchemy import text

from scripts.stack import Stack
from scripts.standins import build_report, full_analysis
from server.db import get_engine
from tests.support.api import bearer

SWEEP = {
    "model": "tiny-gqa",
    "variants": [{"attention": "folded", "context": 128}],
    "devices": ["iphone-17-pro"],
    "prompts": 3,
    "decode_tokens": 4,
    "repetitions": 2,
}
SHORT_LEASE = {"DECODEBENCH_LEASE_SECONDS": "4", "DECODEBENCH_HEARTBEAT_INTERVAL_S": "1"}
OUTAGE_S = 65.0


def _complete_with_a_package(client: httpx.Client, build: dict, worker_token: str) -> None:
    """Act as a build worker with a (tiny) zipped .mlpackage the agent accepts."""
    packed = io.BytesIO()
    with zipfile.ZipFile(packed, "w") as archive:
        archive.writestr("model.mlpackage/Manifest.json", json.dumps({"itemInfoEntries": {}}))
    payload = packed.getvalue()
    sha256 = hashlib.sha256(payload).hexdigest()
    headers = bearer(worker_token)
    lease = client.post(
        f"/api/v1/builds/{build['id']}/start", json={"worker": "w1"}, headers=headers
    ).json()["lease"]
    assert client.put(f"/api/v1/artifacts/{sha256}", content=payload, headers=headers).is_success
    report = build_report(build, full_analysis({"bytes_per_token": {"total": 50_000_000}}))
    done = client.post(
        f"/api/v1/builds/{build['id']}/complete",
        json={"lease": lease, "artifact_sha256": sha256, "report": report},
        headers=headers,
    )
    assert done.status_code == 200, done.text


def _runs(stack: Stack, sweep_id: int) -> list[dict]:
    response = httpx.get(
        f"{stack.server_url}/api/v1/sweeps/{sweep_id}", headers=bearer(stack.tokens["user"]),
        timeout=10,
    )  # fmt: skip
    return response.json()["runs"]


def _stop_server(stack: Stack) -> None:
    server = stack.processes.pop("server")
    os.killpg(server.pid, signal.SIGTERM)
    server.wait(timeout=20)


def test_results_finished_during_an_outage_arrive_once_and_nothing_runs_twice(
    stack: Stack,
) -> None:
    _stop_server(stack)  # the fixture's server, restarted with a short lease
    stack.start_server(**SHORT_LEASE)
    with httpx.Client(base_url=stack.server_url, timeout=30) as client:
        sweep = client.post("/api/v1/sweeps", json=SWEEP, headers=bearer(stack.tokens["user"]))
        for build in sweep.json()["builds"]:
            _complete_with_a_package(client, build, stack.tokens["worker"])
    sweep_id = sweep.json()["id"]
    # each simulated run lasts a few seconds, so the server can go away in the middle of one
    stack.start_agent(["iphone-17-pro"], "--time-scale", "5", "--poll-interval", "0.5")
    deadline = time.monotonic() + 60
    artifacts = stack.var_dir / "agent" / "artifacts"
    while not list(artifacts.glob("*.zip")):  # claimed, and the artifact is in: it is running
        assert time.monotonic() < deadline, "the agent never started a run"
        stack.check_alive()
        time.sleep(0.05)
    _stop_server(stack)
    outage_started = time.monotonic()
    outbox = stack.var_dir / "agent" / "outbox"
    while not list(outbox.glob("*-run-*.json")):
        assert time.monotonic() - outage_started < OUTAGE_S, "no result reached the outbox"
        stack.check_alive()
        time.sleep(0.5)
    time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - outage_started)))
    stack.check_alive()  # the agent rode out the outage
    stack.start_server(**SHORT_LEASE)
    deadline = time.monotonic() + 60
    while {run["state"] for run in _runs(stack, sweep_id)} != {"succeeded"}:
        assert time.monotonic() < deadline, _runs(stack, sweep_id)
        stack.check_alive()
        time.sleep(0.5)
    runs = _runs(stack, sweep_id)
    assert [run["attempts"] for run in runs] == [1, 1], runs
    assert not list(outbox.glob("*-run-*.json"))
    with get_engine().connect() as connection:
        stored = connection.execute(
            text("SELECT run_id, count(*) FROM prompt_results GROUP BY run_id ORDER BY run_id")
        ).all()
        claims = connection.execute(
            text("SELECT count(*) FROM transitions WHERE entity = 'run' AND to_state = 'running'")
        ).scalar_one()
    assert [count for _, count in stored] == [3, 3]
    assert claims == 2  # one claim per run: none was executed again
    log = (stack.var_dir / "agent.log").read_text()
    assert "not delivered" in log and "delivered the results of run" in log


def test_a_database_that_cannot_be_reached_is_503_with_retry_after_never_500(tmp_path) -> None:
    """A server whose PostgreSQL refuses connections (restarting, say) tells every request to
    come back later: 503 with Retry-After, the same as a saturated pool, not a server error."""
    unreachable = "postgresql+psycopg://postgres@127.0.0.1:9/nowhere"  # the discard port
    stack = Stack(database_url=unreachable, broker_url="memory://", var_dir=tmp_path / "var")
    stack.var_dir.mkdir(parents=True)
    try:
        stack.start_server(health=503)  # health answers 503 while the database is away
        headers = bearer("dbk_user_anything")
        for method, path in (("GET", "/api/v1/sweeps"), ("POST", "/api/v1/agents/heartbeat")):
            answer = httpx.request(method, f"{stack.server_url}{path}", headers=headers,
                                   json={"devices": []}, timeout=30)  # fmt: skip
            assert answer.status_code == 503, (path, answer.text)
            assert answer.headers["Retry-After"].isdigit()
            assert "database is unavailable" in answer.json()["detail"]
        assert "Traceback" not in (stack.var_dir / "server.log").read_text()
    finally:
        stack.stop()
