"""A sweep submitted over HTTP runs to completion through real Celery, Redis and an agent process."""

from __future__ import annotations

import pytest

from decodebench.client import DecodebenchClient
from decodebench.commands.submit import wait_for_sweep
from scripts.stack import Stack
from tests.support.services import table_counts

pytestmark = pytest.mark.slow

SWEEP = {
    "model": "tiny-gqa",
    "variants": [
        {"attention": "repeat_kv", "context": 256},
        {"attention": "folded", "context": 256},
    ],
    "devices": ["iphone-16-pro", "iphone-17-pro"],
    "prompts": 30,
    "decode_tokens": 16,
}


def test_sweep_completes_through_worker_and_agent(stack: Stack) -> None:
    stack.start_worker()
    stack.start_agent(SWEEP["devices"])
    with DecodebenchClient(stack.server_url, stack.tokens["user"]) as client:
        submitted = client.submit_sweep(SWEEP)
        sweep = wait_for_sweep(client, submitted.id, timeout_s=600).model_dump(mode="json")
    stack.check_alive()

    assert sweep["state"] == "completed", sweep
    assert [build["state"] for build in sweep["builds"]] == ["succeeded", "succeeded"]
    repeat_kv, folded = (build["analysis"] for build in sweep["builds"])
    assert repeat_kv["tile_ops"] == 4 and folded["tile_ops"] == 0  # 2 layers x (K, V)
    assert repeat_kv["bytes_per_token"]["total"] > folded["bytes_per_token"]["total"]

    rows = {(row["device_class"], row["variant"]): row for row in sweep["results"]}
    for device_class in SWEEP["devices"]:
        slow = rows[(device_class, "repeat_kv-ctx256-fp16")]
        fast = rows[(device_class, "folded-ctx256-fp16")]
        assert slow["prompts_measured"] == fast["prompts_measured"] == 30
        assert slow["simulated"] is True and fast["simulated"] is True
        assert fast["speedup_vs_first"] > 1.0
    assert (
        rows[("iphone-17-pro", "folded-ctx256-fp16")]["decode_tok_s_mean"]
        > rows[("iphone-16-pro", "folded-ctx256-fp16")]["decode_tok_s_mean"]
    )
    counts = table_counts()
    assert counts["prompt_results"] == 2 * 2 * 30
    assert counts["builds"] == 2
