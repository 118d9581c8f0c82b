"""Size limits hold while the body streams in, and one unreadable stored row jams no queue."""

from __future__ import annotations

import asyncio
import hashlib
import json

import httpx
import pytest
from sqlalchemy import text

from decodebench.contracts.protocol import ClaimRequest
from scripts.stack import Stack
from server.db import get_engine
from tests.support.api import bearer
from tests.support.sweeps import DEVICE, SWEEP, finish_builds

MIB = 1024 * 1024
LIMITS = {"DECODEBENCH_MAX_BODY_BYTES": str(MIB), "DECODEBENCH_MAX_ARTIFACT_BYTES": str(8 * MIB)}


@pytest.fixture
def limited(stack: Stack) -> Stack:
    server = stack.processes.pop("server")
    server.terminate()
    server.wait(timeout=20)
    stack.start_server(**LIMITS)
    return stack


def _huge_sweep() -> bytes:
    variants = [{"attention": "folded", "context": 128}] * 250_000
    body = json.dumps({"model": "tiny-gqa", "variants": variants, "devices": ["iphone-17-pro"]})
    assert len(body) > 10_000_000  # 10 MB
    return body.encode()


def test_a_huge_json_body_is_refused_before_it_is_parsed(limited: Stack) -> None:
    headers = bearer(limited.tokens["user"]) | {"Content-Type": "application/json"}
    url = f"{limited.server_url}/api/v1/sweeps"
    declared = httpx.post(url, content=_huge_sweep(), headers=headers, timeout=30)
    assert declared.status_code == 413
    assert "exceeds this server's limit of 1048576 bytes" in declared.json()["detail"]
    body = _huge_sweep()

    def chunked():  # no Content-Length: the limit must hold while the body streams in
        for start in range(0, len(body), 64 * 1024):
            yield body[start : start + 64 * 1024]

    streamed = httpx.post(url, content=chunked(), headers=headers, timeout=30)
    assert streamed.status_code == 413
    listed = httpx.get(url, headers=bearer(limited.tokens["user"]), timeout=10).json()
    assert listed == []


def test_a_1_gib_artifact_with_a_wrong_hash_is_cut_off_at_the_limit(limited: Stack) -> None:
    wrong = hashlib.sha256(b"something else").hexdigest()
    url = f"{limited.server_url}/api/v1/artifacts/{wrong}"
    headers = bearer(limited.tokens["worker"])
    chunk = b"\0" * MIB

    def gibibyte():
        for _ in range(1024):
            yield chunk

    try:
        response = httpx.put(url, content=gibibyte(), headers=headers, timeout=120)
        assert response.status_code == 413, response.text
        assert "DECODEBENCH_MAX_ARTIFACT_BYTES" in response.json()["detail"]
    except httpx.TransportError:
        pass  # the server may close the connection while the client is still sending
    artifacts = limited.var_dir / "artifacts"
    assert not [path for path in artifacts.rglob("*") if path.is_file()]
    declared = httpx.put(
        url, content=b"x" * (9 * MIB), headers=headers, timeout=60
    )  # a declared Content-Length over the limit is refused before a byte is read
    assert declared.status_code == 413


def test_the_limit_stops_reading_a_streamed_body_at_the_limit(monkeypatch) -> None:
    """Below HTTP: the handler sees the 413 once the limit is passed, and no chunk after it is
    pulled from the connection."""
    from server.config import get_settings
    from server.limits import BodyLimit, BodyTooLarge

    monkeypatch.setattr(get_settings(), "max_body_bytes", MIB)
    pulled = 0

    async def receive() -> dict:
        nonlocal pulled
        pulled += 1
        return {"type": "http.request", "body": b"x" * 65536, "more_body": pulled < 1000}

    async def handler(scope, receive, send) -> None:
        while (await receive())["more_body"]:
            pass

    scope = {"type": "http", "method": "POST", "path": "/api/v1/sweeps", "headers": []}
    with pytest.raises(BodyTooLarge, match="exceeds this server's limit of 1048576 bytes"):
        asyncio.run(BodyLimit(handler)(scope, receive, None))
    assert pulled == MIB // 65536 + 1


def test_a_claim_fails_a_run_it_cannot_assign_and_hands_out_the_next(
    api, user_token, worker_token, agent_token
) -> None:
    sweep = api.post("/api/v1/sweeps", json=SWEEP, headers=bearer(user_token)).json()
    finish_builds(api, sweep, worker_token)
    api.post(
        "/api/v1/agents/register",
        json={"name": "host-1", "devices": [DEVICE]},
        headers=bearer(agent_token),
    )
    with get_engine().begin() as connection:  # the first run's stored report no longer reads
        bad_build = connection.execute(
            text("SELECT build_id FROM runs ORDER BY attempts, sweep_id, order_key, id LIMIT 1")
        ).scalar_one()
        connection.execute(
            text(
                """UPDATE builds SET report = '{"analysis": {"hello": "world"}}' WHERE id = :id"""
            ),
            {"id": bad_build},
        )
    claim = api.post(
        "/api/v1/agents/claim", json={"device_udid": "SIM-0001"}, headers=bearer(agent_token)
    )
    assert claim.status_code == 200, claim.text
    assert claim.json()["run"]["build_id"] != bad_build
    with get_engine().connect() as connection:
        failed = connection.execute(
            text("SELECT build_id, failure_reason FROM runs WHERE state = 'failed'")
        ).all()
    assert failed and all(build_id == bad_build for build_id, _ in failed)
    assert all("cannot assign run" in reason for _, reason in failed), failed


def test_a_storm_of_claims_leaves_slots_for_every_other_request(monkeypatch) -> None:
    """A thousand devices woken at once queue for the claims' share of the admission slots; a
    build's completion (or a result upload) arriving behind them is admitted at once, not told
    503 after the pool timeout."""
    from server import limits
    from server.config import get_settings

    settings = get_settings()
    monkeypatch.setattr(settings, "db_pool_size", 3)
    monkeypatch.setattr(settings, "db_max_overflow", 1)
    monkeypatch.setattr(settings, "db_pool_timeout_s", 0.5)
    monkeypatch.setattr(limits, "_slots", None)
    assert [limits.claim_share(total) for total in (1, 2, 4, 12)] == [1, 1, 3, 9]

    async def scenario() -> tuple[int, int, float]:
        holding = 0
        most = 0
        release = asyncio.Event()

        async def look() -> None:
            nonlocal holding, most
            async with limits.admitted(claim_wait_s=30):
                holding += 1
                most = max(most, holding)
                await release.wait()
                holding -= 1

        looks = [asyncio.create_task(look()) for _ in range(50)]
        loop = asyncio.get_running_loop()
        until = loop.time() + 10
        while most < 3 and loop.time() < until:  # the first looks are in (polled: a loaded machine)
            await asyncio.sleep(0.01)
        started = loop.time()
        async with limits.admitted():  # behind 50 claims; 3 of the 4 slots are theirs
            other_waited = loop.time() - started
        queued = sum(not task.done() for task in looks)
        release.set()
        await asyncio.gather(*looks)
        return most, queued, other_waited

    most, queued, other_waited = asyncio.run(scenario())
    assert most == 3  # claims never held the last slot
    assert queued == 50  # they waited for their share beyond the pool timeout, not 503
    assert other_waited < 0.2


def test_a_long_poll_that_waits_out_its_turn_is_answered_empty_not_503(monkeypatch) -> None:
    """Past its deadline in the admission queue, a long poll ends as any long poll does (no run;
    the agent claims again at once); a plain claim that finds no slot is still a 503."""
    from server.agents import endpoints, longpoll
    from server.limits import ServerBusy

    looked: list[float] = []

    async def saturated(look, wait_s: float):
        looked.append(wait_s)
        raise ServerBusy

    class Request:  # what the long poll reads of it: the client going away (it never does)
        async def receive(self) -> dict:
            await asyncio.Event().wait()
            return {}

    monkeypatch.setattr(longpoll, "_look", saturated)
    long_poll = ClaimRequest(device_udid="SIM-1", wait_seconds=30)
    answer = asyncio.run(endpoints.claim(long_poll, Request()))
    assert answer.run is None and 29 < looked[0] <= 30  # it could wait its whole long poll
    plain = asyncio.run(endpoints.claim(ClaimRequest(device_udid="SIM-1"), Request()))
    assert plain.status_code == 503 and plain.headers["retry-after"]
