"""Scheduling: idempotent claims, fair share and priorities between sweeps, long-poll wake-ups."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import httpx
import pytest

from tests.support.api import bearer
from tests.support.proxy import lost_then_retried
from tests.support.services import query
from tests.support.sweeps import DEVICE, SWEEP, finish_builds, register, submit

CLASS = DEVICE["device_class"]


def claim(client, agent_token: str, udid: str, **extra) -> dict | None:
    response = client.post(
        "/api/v1/agents/claim", json={"device_udid": udid, **extra}, headers=bearer(agent_token)
    )
    assert response.status_code == 200, response.text
    return response.json()["run"]


# Fair share and priorities


def test_two_sweeps_on_one_class_interleave(api, user_token, worker_token, agent_token) -> None:
    first = submit(api, user_token, worker_token, repetitions=4)  # 8 runs
    second = submit(api, user_token, worker_token, repetitions=4)
    register(api, agent_token, 6)
    taken = [claim(api, agent_token, f"SIM-{i:04d}")["sweep_id"] for i in range(6)]
    # Devices held at once split evenly; the second sweep does not wait behind the first.
    assert taken == [first, second, first, second, first, second]


def test_one_device_alternates_between_sweeps_of_one_priority(
    api, user_token, worker_token, agent_token
) -> None:
    first = submit(api, user_token, worker_token, repetitions=2)
    second = submit(api, user_token, worker_token, repetitions=2)
    register(api, agent_token, 1)
    order = []
    for _ in range(4):
        run = claim(api, agent_token, "SIM-0000")
        order.append(run["sweep_id"])
        query("UPDATE runs SET state = 'succeeded' WHERE id = :id", id=run["run_id"])
    assert order == [first, second, first, second]


def test_a_ci_sweep_overtakes_a_queued_nightly_one(
    api, user_token, worker_token, agent_token
) -> None:
    nightly = submit(api, user_token, worker_token, repetitions=3, priority="nightly")
    register(api, agent_token, 5)
    assert claim(api, agent_token, "SIM-0000")["sweep_id"] == nightly
    ci = submit(api, user_token, worker_token, repetitions=3, priority="ci")
    # CI weighs 4, nightly 2: the next free device goes to CI, and CI keeps twice nightly's
    # share ((running + 1) / weight: CI 1/4, 2/4, 3/4 before nightly's 2/2 comes up)
    taken = [claim(api, agent_token, f"SIM-{i:04d}")["sweep_id"] for i in (1, 2, 3, 4)]
    assert taken == [ci, ci, ci, nightly]
    assert query("SELECT priority FROM sweeps ORDER BY id") == [("nightly",), ("ci",)]


def test_a_starving_sweep_ages_past_a_higher_priority(
    api, user_token, worker_token, agent_token
) -> None:
    adhoc = submit(api, user_token, worker_token, repetitions=2)
    ci = submit(api, user_token, worker_token, repetitions=2, priority="ci")
    register(api, agent_token, 1)
    assert claim(api, agent_token, "SIM-0000")["sweep_id"] == ci
    query("UPDATE runs SET state = 'succeeded' WHERE state = 'running'")
    # the ad hoc sweep has had no device for 20 minutes (weight 1 × (1 + 1200/300) = 5 > 4)
    query(
        "UPDATE sweeps SET created_at = :then WHERE id = :id",
        then=datetime.now(UTC) - timedelta(minutes=20),
        id=adhoc,
    )
    assert claim(api, agent_token, "SIM-0000")["sweep_id"] == adhoc


def test_priority_must_be_known(api, user_token) -> None:
    response = api.post(
        "/api/v1/sweeps", json={**SWEEP, "priority": "urgent"}, headers=bearer(user_token)
    )
    assert response.status_code == 422 and "priority" in response.text
    assert query("SELECT count(*) FROM sweeps") == [(0,)]


# Idempotent claims


def test_the_same_claim_key_gets_the_same_run_and_a_new_one_frees_it(
    api, user_token, worker_token, agent_token
):
    submit(api, user_token, worker_token)
    register(api, agent_token, 1)
    first = claim(api, agent_token, "SIM-0000", claim_key="key-one-1")
    again = claim(api, agent_token, "SIM-0000", claim_key="key-one-1")
    assert again["run_id"] == first["run_id"]
    assert again["lease_expires_at"] >= first["lease_expires_at"]  # renewed, not a new run
    assert query("SELECT count(*) FROM runs WHERE state = 'running'") == [(1,)]
    # without a key a busy device is refused; with a new key its old run is queued again
    refused = api.post(
        "/api/v1/agents/claim", json={"device_udid": "SIM-0000"}, headers=bearer(agent_token)
    )
    assert refused.status_code == 409
    other = claim(api, agent_token, "SIM-0000", claim_key="key-two-2")
    assert other["run_id"] != first["run_id"]
    assert query("SELECT state, failure_reason FROM runs WHERE id = :id", id=first["run_id"]) == [
        ("queued", "device SIM-0000 claimed anew; its agent gave the run up")
    ]


@pytest.mark.parametrize("key", ["short", "x" * 65, "has space!", ""])
def test_a_malformed_claim_key_is_refused(api, user_token, agent_token, key) -> None:
    register(api, agent_token, 1)
    response = api.post(
        "/api/v1/agents/claim",
        json={"device_udid": "SIM-0000", "claim_key": key},
        headers=bearer(agent_token),
    )
    assert response.status_code == 422 and "claim_key" in response.text


def test_a_claim_whose_answer_is_lost_gets_the_same_run_when_retried(stack) -> None:
    """A real server process; the first claim's answer is dropped between server and agent."""
    tokens = stack.tokens
    with httpx.Client(base_url=stack.server_url, timeout=30) as direct:
        sweep_id = submit(direct, tokens["user"], tokens["worker"])
        register(direct, tokens["agent"], 1)
    body = {"device_udid": "SIM-0000", "claim_key": "lost-answer-0001"}
    held, retried = lost_then_retried(stack, "/api/v1/agents/claim", body)
    # the server did claim a run for the device, and nobody had it before the retry
    assert len(held) == 1
    assert retried.status_code == 200, retried.text
    run = retried.json()["run"]
    assert (run["run_id"], run["sweep_id"]) == (held[0][1], sweep_id)
    assert query("SELECT count(*) FROM runs WHERE state = 'running'") == [(1,)]
    claims = query(
        "SELECT count(*) FROM transitions WHERE entity = 'run' AND reason LIKE 'claimed for %'"
    )
    assert claims == [(1,)]


# Wake, don't poll


def test_waiting_claims_hold_nothing_and_wake_when_a_run_becomes_claimable(stack) -> None:
    """60 long-poll claims (more than the server's pool of 8 + 4 connections) wait on a real
    server process; a build finishing makes its runs claimable and wakes them at once."""
    import asyncio
    import time

    tokens = stack.tokens
    devices = 60
    with httpx.Client(base_url=stack.server_url, timeout=30) as client:
        register(client, tokens["agent"], devices)
        sweep = client.post(
            "/api/v1/sweeps", json={**SWEEP, "repetitions": 2}, headers=bearer(tokens["user"])
        ).json()

    async def scenario() -> tuple[list[float], float, list, list]:
        async with httpx.AsyncClient(
            base_url=stack.server_url, timeout=30, limits=httpx.Limits(max_connections=None)
        ) as client:

            async def long_poll(index: int) -> tuple[dict | None, float]:
                response = await client.post(
                    "/api/v1/agents/claim",
                    json={"device_udid": f"SIM-{index:04d}", "wait_seconds": 15},
                    headers=bearer(tokens["agent"]),
                )
                assert response.status_code == 200, response.text
                return response.json()["run"], time.monotonic()

            polls = [asyncio.create_task(long_poll(i)) for i in range(devices)]
            # once every claim has looked at the (empty) queue, none holds a connection in a
            # transaction or a query while it waits (polled: the machine may be loaded)
            for _ in range(40):
                await asyncio.sleep(0.25)
                busy = query(
                    "SELECT state, count(*) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                    " AND state <> 'idle' GROUP BY state"
                )
                if not busy:
                    break
            assert not any(poll.done() for poll in polls)
            health_started = time.monotonic()
            assert (await client.get("/api/v1/health")).status_code == 200
            health_s = time.monotonic() - health_started

            def finish() -> None:
                with httpx.Client(base_url=stack.server_url, timeout=30) as sync_client:
                    finish_builds(sync_client, sweep, tokens["worker"])

            await asyncio.to_thread(finish)
            ready = time.monotonic()
            answered = []
            pending = set(polls)
            while len(answered) < 4 and pending:
                done, pending = await asyncio.wait(
                    pending, timeout=10, return_when=asyncio.FIRST_COMPLETED
                )
                if not done:
                    break
                answered += [poll.result() for poll in done if poll.result()[0] is not None]
            for poll in pending:  # the others would wait out their 15 s
                poll.cancel()
            return [at - ready for _, at in answered], health_s, busy, [run for run, _ in answered]

    pickups, health_s, busy, runs = asyncio.run(scenario())
    assert busy == []  # no connection is in a transaction or a query while claims wait
    assert health_s < 1.0
    # the sweep has 4 runs: 4 devices got one within a second, not at the next poll
    assert len(pickups) == 4 and max(pickups) < 1.0, pickups
    assert len({run["run_id"] for run in runs if run}) == 4
