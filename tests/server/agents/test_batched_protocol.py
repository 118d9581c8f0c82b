"""The batched agent protocol: claims for many devices and results of many runs in one request,
with the rules of the single requests (fair share, idempotent claim keys, per-run refusals)."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.support.api import bearer
from tests.support.claims import claims, given, keyed
from tests.support.services import query
from tests.support.sweeps import register, result_for, submit


def test_a_batch_shares_devices_between_sweeps_as_single_claims_do(
    api, user_token, worker_token, agent_token
) -> None:
    first = submit(api, user_token, worker_token, repetitions=4)  # 8 runs each
    second = submit(api, user_token, worker_token, repetitions=4)
    register(api, agent_token, 6)
    runs = given(claims(api, agent_token, keyed(6)))
    # one request, one ranking read, and still an even split, alternating by device
    assert [runs[f"SIM-{i:04d}"]["sweep_id"] for i in range(6)] == [first, second] * 3
    assert len({run["run_id"] for run in runs.values()}) == 6
    assert query("SELECT count(*) FROM runs WHERE state = 'running'") == [(6,)]


def test_a_ci_sweep_takes_more_of_a_batch_than_a_nightly_one(
    api, user_token, worker_token, agent_token
) -> None:
    nightly = submit(api, user_token, worker_token, repetitions=5, priority="nightly")
    ci = submit(api, user_token, worker_token, repetitions=5, priority="ci")
    register(api, agent_token, 6)
    taken = [run["sweep_id"] for run in given(claims(api, agent_token, keyed(6))).values()]
    # weights 4 and 2: CI holds twice nightly's devices
    assert (taken.count(ci), taken.count(nightly)) == (4, 2)


def test_a_batch_repeated_with_the_same_keys_gets_the_same_runs(
    api, user_token, worker_token, agent_token
) -> None:
    submit(api, user_token, worker_token, repetitions=3)  # 6 runs
    register(api, agent_token, 3)
    first = given(claims(api, agent_token, keyed(3)))
    again = given(claims(api, agent_token, keyed(3)))
    assert {u: r["run_id"] for u, r in again.items()} == {u: r["run_id"] for u, r in first.items()}
    assert query("SELECT count(*) FROM runs WHERE state = 'running'") == [(3,)]
    # a new key for one device gives its run up and hands it another
    renewed = given(claims(api, agent_token, [("SIM-0001", "new-key-0001")]))
    assert renewed["SIM-0001"]["run_id"] != first["SIM-0001"]["run_id"]
    assert query("SELECT state FROM runs WHERE id = :id", id=first["SIM-0001"]["run_id"]) == [
        ("queued",)
    ]


def test_devices_left_without_a_run_get_none_and_nothing_is_held(
    api, user_token, worker_token, agent_token
) -> None:
    submit(api, user_token, worker_token, repetitions=1)  # 2 runs
    register(api, agent_token, 5)
    runs = given(claims(api, agent_token, keyed(5)))
    assert len(runs) == 2
    assert given(claims(api, agent_token, keyed(5, "other")[2:])) == {}


def test_a_device_of_no_agent_refuses_the_whole_batch_and_claims_nothing(
    api, user_token, worker_token, agent_token
) -> None:
    submit(api, user_token, worker_token, repetitions=3)
    register(api, agent_token, 2)
    response = claims(api, agent_token, [*keyed(2), ("SIM-9999", "stray-key-9999")])
    assert response.status_code == 404 and "SIM-9999" in response.text
    assert query("SELECT count(*) FROM runs WHERE state = 'running'") == [(0,)]


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"claims": []}, "claims"),
        ({"claims": [{"device_udid": "SIM-0000"}]}, "claim_key"),
        (
            {"claims": [{"device_udid": "SIM-0000", "claim_key": "dup-key-0000"}] * 2},
            "claimed twice",
        ),
        ({"claims": [{"device_udid": "SIM-0000", "claim_key": "bad key"}]}, "claim_key"),
        (
            {
                "claims": [{"device_udid": "SIM-0000", "claim_key": "ok-key-0000"}],
                "wait_seconds": 61,
            },
            "wait_seconds",
        ),
    ],
)
def test_a_malformed_batch_is_refused_naming_what_is_wrong(api, agent_token, body, named) -> None:
    register(api, agent_token, 1)
    response = api.post("/api/v1/agents/claims", json=body, headers=bearer(agent_token))
    assert response.status_code == 422 and named in response.text


def test_a_batch_claim_needs_an_agent_token(api, user_token) -> None:
    body = {"claims": [{"device_udid": "SIM-0000", "claim_key": "ok-key-0000"}]}
    response = api.post("/api/v1/agents/claims", json=body, headers=bearer(user_token))
    assert response.status_code == 403


# Results


def upload(run_id: int, udid: str, prompts: range = range(3)) -> dict:
    return {"run_id": run_id, "result": result_for(prompts, 40.0, udid=udid)}


def _with_nan(body: dict) -> dict:
    body["result"]["prompts"][0]["decode_tok_s"] = float("nan")  # json.dumps writes NaN
    return body


def test_a_batch_of_results_stores_each_run_and_refuses_each_bad_one_alone(
    api, user_token, worker_token, agent_token
) -> None:
    sweep_id = submit(api, user_token, worker_token, repetitions=1)  # 2 runs
    register(api, agent_token, 2)
    runs = given(claims(api, agent_token, keyed(2)))
    first, second = runs["SIM-0000"]["run_id"], runs["SIM-0001"]["run_id"]
    body = {
        "uploads": [
            upload(first, "SIM-0000"),
            upload(second, "SIM-0000"),  # the other device's results: refused, 422
            upload(987654, "SIM-0000"),  # no such run: 404
        ]
    }
    response = api.post("/api/v1/agents/results", json=body, headers=bearer(agent_token))
    assert response.status_code == 200, response.text
    outcomes = {o["run_id"]: o for o in response.json()["outcomes"]}
    assert outcomes[first]["status"] == 200 and outcomes[first]["state"] == "succeeded"
    assert outcomes[first]["prompts_stored"] == 3
    assert outcomes[second]["status"] == 422 and "SIM-0001" in outcomes[second]["detail"]
    assert outcomes[987654]["status"] == 404
    assert query("SELECT count(*) FROM prompt_results WHERE run_id = :id", id=second) == [(0,)]
    assert query("SELECT state FROM runs WHERE id = :id", id=second) == [("running",)]
    # the second run's own results complete the sweep; sent again, both are answered as stored
    body = {"uploads": [upload(second, "SIM-0001"), upload(first, "SIM-0000")]}
    response = api.post("/api/v1/agents/results", json=body, headers=bearer(agent_token))
    assert [o["status"] for o in response.json()["outcomes"]] == [200, 200]
    assert query("SELECT state FROM sweeps WHERE id = :id", id=sweep_id) == [("completed",)]
    assert query("SELECT count(*) FROM prompt_results") == [(6,)]


def test_a_changed_result_for_an_ended_run_is_refused_in_a_batch(
    api, user_token, worker_token, agent_token
) -> None:
    submit(api, user_token, worker_token, repetitions=1)
    register(api, agent_token, 1)
    run_id = given(claims(api, agent_token, keyed(1)))["SIM-0000"]["run_id"]
    body = {"uploads": [upload(run_id, "SIM-0000")]}
    assert (
        api.post("/api/v1/agents/results", json=body, headers=bearer(agent_token)).status_code
        == 200
    )
    changed = upload(run_id, "SIM-0000")
    changed["result"]["prompts"][0]["decode_tok_s"] = 1.0
    response = api.post(
        "/api/v1/agents/results", json={"uploads": [changed]}, headers=bearer(agent_token)
    )
    [outcome] = response.json()["outcomes"]
    assert outcome["status"] == 409 and "immutable" in outcome["detail"]


@pytest.mark.parametrize(
    ("uploads", "named"),
    [
        ([], "uploads"),
        ([upload(1, "SIM-0000"), upload(1, "SIM-0000")], "appears twice"),
        ([upload(1, "SIM-0000") for _ in range(201)], "uploads"),
        ([{"run_id": 1, "result": {"prompts": "none"}}], "result"),
        ([_with_nan(upload(1, "SIM-0000"))], "finite"),
    ],
)
def test_a_malformed_results_batch_is_refused_whole(api, agent_token, uploads, named) -> None:
    content = json.dumps({"uploads": uploads})
    response = api.post(
        "/api/v1/agents/results",
        content=content,
        headers={**bearer(agent_token), "Content-Type": "application/json"},
    )
    assert response.status_code == 422 and named in response.text


# Long polls


def test_waiting_batches_hold_no_slot_and_wake_when_runs_become_claimable(stack) -> None:
    """30 batched long polls of 2 devices each (more than the server's 8 + 4 connections) wait
    on a real server process; a heartbeat is admitted at once meanwhile, and a build finishing
    hands its runs to waiting batches."""
    import asyncio
    import time

    from tests.support.sweeps import SWEEP, finish_builds

    tokens = stack.tokens
    batches = 30
    with httpx.Client(base_url=stack.server_url, timeout=30) as client:
        register(client, tokens["agent"], 2 * batches)
        sweep = client.post(
            "/api/v1/sweeps", json={**SWEEP, "repetitions": 2}, headers=bearer(tokens["user"])
        ).json()

    async def scenario() -> tuple[float, list[dict]]:
        async with httpx.AsyncClient(
            base_url=stack.server_url, timeout=30, limits=httpx.Limits(max_connections=None)
        ) as client:

            async def long_poll(index: int) -> dict:
                pairs = keyed(2 * batches)[2 * index : 2 * index + 2]
                body = {
                    "claims": [{"device_udid": u, "claim_key": k} for u, k in pairs],
                    "wait_seconds": 20,
                }
                response = await client.post(
                    "/api/v1/agents/claims", json=body, headers=bearer(tokens["agent"])
                )
                return given(response)

            polls = [asyncio.create_task(long_poll(i)) for i in range(batches)]
            await asyncio.sleep(2.0)  # every batch has looked and waits
            assert not any(poll.done() for poll in polls)
            started = time.monotonic()
            beat = await client.post(
                "/api/v1/agents/heartbeat", json={"devices": []}, headers=bearer(tokens["agent"])
            )
            heartbeat_s = time.monotonic() - started
            assert beat.status_code == 204, beat.text

            def finish() -> None:
                with httpx.Client(base_url=stack.server_url, timeout=30) as sync_client:
                    finish_builds(sync_client, sweep, tokens["worker"])

            await asyncio.to_thread(finish)
            answered: list[dict] = []
            pending = set(polls)
            deadline = time.monotonic() + 10
            while sum(len(a) for a in answered) < 4 and pending and time.monotonic() < deadline:
                done, pending = await asyncio.wait(
                    pending, timeout=1, return_when=asyncio.FIRST_COMPLETED
                )
                answered += [poll.result() for poll in done]
            for poll in pending:
                poll.cancel()
            return heartbeat_s, answered

    heartbeat_s, answered = asyncio.run(scenario())
    assert heartbeat_s < 2.0  # a waiting batch holds no admission slot (the pool waits 5 s)
    runs = [run for answer in answered for run in answer.values()]
    assert len(runs) == 4 and len({run["run_id"] for run in runs}) == 4


def test_a_results_batch_ending_two_sweeps_completes_both(
    api, user_token, worker_token, agent_token
) -> None:
    sweeps = [submit(api, user_token, worker_token, repetitions=1) for _ in range(2)]
    register(api, agent_token, 4)
    runs = given(claims(api, agent_token, keyed(4)))
    body = {"uploads": [upload(run["run_id"], udid) for udid, run in runs.items()]}
    response = api.post("/api/v1/agents/results", json=body, headers=bearer(agent_token))
    outcomes = response.json()["outcomes"]
    assert [o["run_id"] for o in outcomes] == sorted(run["run_id"] for run in runs.values())
    assert {o["status"] for o in outcomes} == {200}
    states = query("SELECT id, state FROM sweeps ORDER BY id")
    assert states == [(sweeps[0], "completed"), (sweeps[1], "completed")]
    finished = query(
        "SELECT count(*) FROM transitions WHERE entity = 'sweep' AND to_state = 'completed'"
    )
    assert finished == [(2,)]
