"""A sweep of two variants on one simulated phone, its builds completed and its results posted
over HTTP as a build worker and an agent would."""

from __future__ import annotations

from tests.support.api import bearer, complete_build

SWEEP = {
    "model": "tiny-gqa",
    "variants": [{"attention": "repeat_kv"}, {"attention": "folded"}],
    "devices": ["iphone-17-pro"],
    "prompts": 3,
    "decode_tokens": 4,
}
DEVICE = {
    "udid": "SIM-0001",
    "device_class": "iphone-17-pro",
    "product_type": "iPhone18,1",
    "os_version": "26.1",
    "driver": "simulated",
    "simulated": True,
}


def analysis(tile_ops: int, bytes_per_token: int) -> dict:
    return {
        "ops_total": 100,
        "op_counts": {"tile": tile_ops},
        "tile_ops": tile_ops,
        "tile_output_bytes": tile_ops * 1024,
        "state_write_ops": 4,
        "weight_bytes": 1000,
        "bytes_per_token": {"total": bytes_per_token},
    }


def finish_builds(api, sweep: dict, worker_token: str) -> None:
    for index, build in enumerate(sweep["builds"]):
        complete_build(
            api, build, worker_token, analysis(2 - 2 * index, 1_000_000 - 400_000 * index)
        )


def result_for(prompt_indexes: range, decode_tok_s: float, udid: str = "SIM-0001") -> dict:
    return {
        "device_udid": udid,
        "device_class": "iphone-17-pro",
        "product_type": "iPhone18,1",
        "driver": "simulated",
        "simulated": True,
        "load_time_cold_ms": 10.0,
        "load_time_warm_ms": 5.0,
        "peak_memory_bytes": 1 << 20,
        "timing_model": "test",
        "prompts": [
            {
                "prompt_index": index,
                "prompt_tokens": 5,
                "generated_tokens": 2,
                "ttft_ms": 3.0,
                "prefill_tok_s": 100.0,
                "decode_tok_s": decode_tok_s + index,
                "token_latencies_ms": [1.0, 1.0],
            }
            for index in prompt_indexes
        ],
    }


def device(index: int) -> dict:
    return {**DEVICE, "udid": f"SIM-{index:04d}"}


def register(client, agent_token: str, count: int) -> None:
    """``count`` simulated phones SIM-0000, SIM-0001, ... on one agent."""
    registration = {"name": "host-1", "devices": [device(i) for i in range(count)]}
    response = client.post(
        "/api/v1/agents/register", json=registration, headers=bearer(agent_token)
    )
    assert response.status_code == 200, response.text


def submit(client, user_token: str, worker_token: str, **extra) -> int:
    """The id of a new sweep (``SWEEP`` with ``extra``) whose builds are done."""
    sweep = client.post(
        "/api/v1/sweeps", json={**SWEEP, **extra}, headers=bearer(user_token)
    ).json()
    if any(build["state"] != "succeeded" for build in sweep["builds"]):
        finish_builds(client, sweep, worker_token)
    return sweep["id"]
