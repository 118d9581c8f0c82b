"""The batched agent protocol: claims for many devices and results of many runs in one request,
with the rules of the single requests (fair share, idempotent claim keys, per-run refusals)."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.support.api import bearer
from tests.support.services import query
from tests.support.sweeps import register, result_for, submit


def claims(api, agent_token: str, pairs: list[tuple[str, str]], **extra):
    body = {"claims": [{"device_udid": u, "claim_key": k} for u, k in pairs], **extra}
    return api.post("/api/v1/agents/claims", json=body, headers=bearer(agent_token))


def given(response) -> dict[str, dict]:
    assert response.status_code == 200, response.text
    return {entry["device_udid"]: entry["run"] for entry in response.json()["runs"]}


def keyed(count: int, tag: str = "k") -> list[tuple[str, str]]:
    return [(f"SIM-{i:04d}", f"{tag}-key-{i:04d}") for i in range(count)]


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


# The agent's side


def test_an_agents_devices_claim_and_upload_in_a_few_requests(stack, tmp_path) -> None:
    """20 devices ask for a run at once and get one each over one or two requests; their 20
    results, finished together, go up in one or two requests and are all stored."""
    import asyncio
    import threading

    from agent.batching import ClaimBatcher
    from agent.outbox import BatchedUploads, Outbox
    from decodebench.client import DecodebenchClient
    from decodebench.contracts.protocol import RunResult

    devices = 20
    tokens = stack.tokens
    with httpx.Client(base_url=stack.server_url, timeout=30) as client:
        register(client, tokens["agent"], devices)
        submit(client, tokens["user"], tokens["worker"], repetitions=10)  # 20 runs
    client = DecodebenchClient(stack.server_url, tokens["agent"])

    async def claim_all() -> tuple[dict[str, int], int]:
        # gathering long enough that a loaded machine still sends them together
        batcher = ClaimBatcher(client.claims, asyncio.Event(), poll_interval_s=1.0, gather_s=0.5)
        answers = await asyncio.gather(*(batcher.claim(f"SIM-{i:04d}", 5) for i in range(devices)))
        await batcher.close()
        runs = {}
        for i, answer in enumerate(answers):
            assert answer is not None and answer.run is not None
            runs[f"SIM-{i:04d}"] = answer.run.run_id
        return runs, batcher.requests

    runs, claim_requests = asyncio.run(claim_all())
    assert len(set(runs.values())) == devices and claim_requests <= 2
    outbox = Outbox(tmp_path / "outbox")
    stop = threading.Event()
    uploads = BatchedUploads(outbox, client.upload_many, client.upload_results, stop, gather_s=0.5)
    entries = [
        outbox.put(
            run_id, RunResult.model_validate(result_for(range(3), 40.0, udid=udid)), hold=True
        )
        for udid, run_id in runs.items()
    ]
    delivered: list[bool] = []
    threads = [
        threading.Thread(target=lambda e=entry: delivered.append(uploads.deliver(e)))
        for entry in entries
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    stop.set()
    client.close()
    assert delivered == [True] * devices and not outbox.refused
    assert uploads.requests <= 2 and not outbox.pending()
    assert query("SELECT count(*) FROM runs WHERE state = 'succeeded'") == [(devices,)]


def test_batched_claims_and_heartbeats_over_the_same_devices_never_deadlock(
    api, user_token, worker_token, agent_token
) -> None:
    """Heartbeats that change some devices and batches claiming others of the same agent, at
    once: each takes the devices' rows in the same order, so none is told 503."""
    import random
    import threading

    from tests.support.sweeps import DEVICE

    devices = 40
    for _ in range(3):
        submit(api, user_token, worker_token, repetitions=10)
    # registered out of order, so the rows' ids do not follow the udids
    order = random.Random(7).sample(range(devices), devices)
    inventory = [{**DEVICE, "udid": f"SIM-{i:04d}"} for i in order]
    registration = {"name": "host-1", "devices": inventory}
    api.post("/api/v1/agents/register", json=registration, headers=bearer(agent_token))
    failures: list[str] = []
    rounds = 25

    def heartbeats() -> None:
        states = ["nominal", "fair"]
        for round_ in range(rounds):
            inventory = [
                {**DEVICE, "udid": f"SIM-{i:04d}", "thermal_state": states[(i + round_) % 2]}
                for i in reversed(range(devices))
            ]
            response = api.post(
                "/api/v1/agents/heartbeat", json={"devices": inventory}, headers=bearer(agent_token)
            )
            if response.status_code != 204:
                failures.append(f"heartbeat {response.status_code}: {response.text}")

    def claiming(seed: int) -> None:
        rng = random.Random(seed)
        for round_ in range(rounds):
            chosen = rng.sample(range(devices), 12)
            pairs = [(f"SIM-{i:04d}", f"c{seed}-{round_}-{i:04d}") for i in chosen]
            response = claims(api, agent_token, pairs)
            if response.status_code != 200:
                failures.append(f"claims {response.status_code}: {response.text}")

    threads = [
        threading.Thread(target=heartbeats),
        *(threading.Thread(target=claiming, args=(s,)) for s in range(3)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert failures == []


def test_a_batch_whose_answer_is_lost_gets_the_same_runs_when_retried(stack) -> None:
    """A real server process; the first batch's answer is dropped between server and agent."""
    from tests.support.proxy import lost_then_retried

    tokens = stack.tokens
    with httpx.Client(base_url=stack.server_url, timeout=30) as direct:
        submit(direct, tokens["user"], tokens["worker"], repetitions=2)  # 4 runs
        register(direct, tokens["agent"], 3)
    body = {"claims": [{"device_udid": u, "claim_key": k} for u, k in keyed(3)]}
    held, retried = lost_then_retried(stack, "/api/v1/agents/claims", body)
    assert len(held) == 3  # the server did claim, and nobody had the runs before the retry
    assert {udid: run["run_id"] for udid, run in given(retried).items()} == dict(held)
    assert query("SELECT count(*) FROM runs WHERE state = 'running'") == [(3,)]
    claimed = query(
        "SELECT count(*) FROM transitions WHERE entity = 'run' AND reason LIKE 'claimed for %'"
    )
    assert claimed == [(3,)]


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


def test_a_held_entry_is_left_to_its_run_by_the_backlog_delivery(tmp_path) -> None:
    """A device delivering the backlog before its claim must not send, alone, the entry a run
    has just handed to a batch; once released (its batch failed, say) it is backlog again."""
    import threading

    from agent.outbox import Outbox
    from decodebench.contracts.protocol import RunResult

    outbox = Outbox(tmp_path / "outbox")
    result = RunResult.model_validate(result_for(range(3), 40.0, udid="SIM-0000"))
    held = outbox.put(7, result, hold=True)
    old = outbox.put(8, result)  # left by an earlier process
    sent: list[int] = []
    stop = threading.Event()
    assert outbox.deliver(lambda run_id, _: sent.append(run_id), stop)
    assert sent == [8] and held.exists() and not old.exists()
    outbox.release(held)
    assert outbox.deliver(lambda run_id, _: sent.append(run_id), stop)
    assert sent == [8, 7] and not outbox.pending()
