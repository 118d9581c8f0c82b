"""The agent's side of the batched protocol against a real server process: its devices' claims and
results gathered into a few requests, batched claims beside heartbeats, a batch's lost answer."""

from __future__ import annotations

import httpx

from tests.support.api import bearer
from tests.support.claims import claims, given, keyed
from tests.support.services import query
from tests.support.sweeps import register, result_for, submit


def test_an_agents_devices_claim_and_upload_in_a_few_requests(stack, tmp_path) -> None:
    """20 devices ask for a run at once and get one each over one or two requests; their 20
    results, finished together, go up in one or two requests and are all stored."""
    import asyncio
    import threading

    from agent.batching import ClaimBatcher
    from agent.outbox import BatchedUploads, Outbox
    from decodebench.client import DecodebenchClient
    from decodebench.contracts.results import RunResult

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
    uploads = BatchedUploads(outbox, client.upload_many, stop, gather_s=0.5)
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
