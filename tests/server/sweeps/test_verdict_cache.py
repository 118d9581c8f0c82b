"""A finished sweep's verdicts are computed once and stored in its row; reads take them from
there, a retried run empties them, and anything but the sweep's own minimum effect is computed."""

from __future__ import annotations

import json

from sqlalchemy import text

from tests.support.api import bearer, complete_build

DEVICE = {
    "udid": "CACHE-1", "device_class": "iphone-17-pro", "product_type": "iPhone18,1",
    "os_version": "26.1", "driver": "simulated", "simulated": True,
}  # fmt: skip
SWEEP = {
    "model": "tiny-gqa", "variants": [{"attention": "repeat_kv"}, {"attention": "folded"}],
    "devices": ["iphone-17-pro"], "prompts": 3, "repetitions": 2,
}  # fmt: skip


def upload_next(api, agent: dict) -> int:
    run = api.post("/api/v1/agents/claim", json={"device_udid": "CACHE-1"}, headers=agent).json()
    run = run["run"]
    rate = 100.0 if run["variant"]["attention"] == "folded" else 60.0
    result = {
        **{key: DEVICE[key] for key in ("device_class", "product_type", "driver", "simulated")},
        "device_udid": DEVICE["udid"],
        "load_time_cold_ms": 1.0, "load_time_warm_ms": 1.0, "peak_memory_bytes": 1000,
        "timing_model": "test",
        "prompts": [
            {"prompt_index": i, "prompt_tokens": 5, "generated_tokens": 2, "ttft_ms": 3.0,
             "prefill_tok_s": 100.0, "decode_tok_s": rate + i + run["run_id"] % 3,
             "token_latencies_ms": [1.0, 1.0]}
            for i in range(3)
        ],
    }  # fmt: skip
    stored = api.post(f"/api/v1/runs/{run['run_id']}/results", json=result, headers=agent)
    assert stored.json()["state"] == "succeeded", stored.text
    return run["run_id"]


def stored_cache(sweep_id: int) -> dict | None:
    from server.db import get_engine

    with get_engine().connect() as connection:
        return connection.execute(
            text("SELECT verdict_cache FROM sweeps WHERE id = :id"), {"id": sweep_id}
        ).scalar_one()


def test_verdicts_are_stored_once_the_sweep_ends_and_judged_again_after_a_retry(
    api, user_token: str, worker_token: str, agent_token: str
) -> None:
    from server.db import get_engine

    user, agent = bearer(user_token), bearer(agent_token)
    api.post("/api/v1/agents/register", json={"name": "h", "devices": [DEVICE]}, headers=agent)
    sweep = api.post("/api/v1/sweeps", json=SWEEP, headers=user).json()
    for build in sweep["builds"]:
        complete_build(api, build, worker_token, {})
    for _ in range(3):
        upload_next(api, agent)
    running = api.get(f"/api/v1/sweeps/{sweep['id']}", headers=user).json()
    assert running["state"] == "running" and len(running["verdicts"]) == 1
    assert stored_cache(sweep["id"]) is None  # nothing is written while runs are going

    ended = api.post(f"/api/v1/sweeps/{sweep['id']}/cancel", headers=user).json()
    assert ended["state"] == "failed" and ended["verdicts"] == running["verdicts"]
    cache = stored_cache(sweep["id"])
    assert cache is not None and cache["verdicts"] == ended["verdicts"]

    # Reads come from the row: a mark put into the stored verdict shows on the API and the page.
    cache["verdicts"][0]["decode_tok_s"]["label"] = "from-the-cache"
    with get_engine().begin() as connection:
        connection.execute(
            text("UPDATE sweeps SET verdict_cache = CAST(:cache AS jsonb) WHERE id = :id"),
            {"cache": json.dumps(cache), "id": sweep["id"]},
        )
    again = api.get(f"/api/v1/sweeps/{sweep['id']}", headers=user).json()
    assert again["verdicts"][0]["decode_tok_s"]["label"] == "from-the-cache"
    verdicts = api.get(f"/api/v1/sweeps/{sweep['id']}/verdicts", headers=user).json()
    assert verdicts["verdicts"][0]["decode_tok_s"]["label"] == "from-the-cache"
    other = api.get(f"/api/v1/sweeps/{sweep['id']}/verdicts?min_effect=0.2", headers=user).json()
    assert other["verdicts"][0]["decode_tok_s"]["label"] != "from-the-cache"  # computed

    cancelled = next(run for run in ended["runs"] if run["state"] == "failed")
    retry = f"/api/v1/sweeps/{sweep['id']}/runs/{cancelled['id']}/retry"
    assert api.post(retry, headers=user).status_code == 200
    assert stored_cache(sweep["id"]) is None
    assert upload_next(api, agent) == cancelled["id"]
    final = api.get(f"/api/v1/sweeps/{sweep['id']}", headers=user).json()
    assert final["state"] == "completed"
    verdict = final["verdicts"][0]["decode_tok_s"]
    assert verdict["label"] == "faster" and verdict["run_pairs"] == 2  # judged on all four runs
    assert stored_cache(sweep["id"])["verdicts"] == final["verdicts"]
