"""The agent with emulated iPhones against the real server, worker, Postgres and Redis.

Each injected fault fails its run with the right reason, the run is retried (on another device
when one is there), and every prompt result is stored exactly once. Health gates keep unfit
devices from claiming, with the reason as the device's status.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from decodebench.client import DecodebenchClient
from decodebench.commands.submit import wait_for_sweep
from emulator.fleet import EmulatedFleet
from scripts.stack import Stack
from tests.support.lab import (
    PROMPTS,
    device_status,
    finish,
    lab,
    query,
    run_reasons,
    sweep_state,
    wait_until,
)
from tests.support.services import table_counts

pytestmark = pytest.mark.slow


@pytest.fixture
def stack(worker_stack: Stack) -> Stack:
    return worker_stack


def test_faults_are_retried_on_other_devices_and_gates_hold_unfit_ones(
    stack: Stack, tmp_path: Path
) -> None:
    fleet = EmulatedFleet(tmp_path / "devices", tokens="off", reattach_after_s=None)
    unplugs = fleet.add("iphone-17-pro", ["disconnect-mid-push"])
    locks = fleet.add("iphone-16-pro", ["lock-during-run"])
    flat = fleet.add("iphone-17-pro", ["battery=10", "charging=false"])
    no_developer_mode = fleet.add("iphone-16-pro", ["developer-mode-off"])
    hot = fleet.add("iphone-17-pro", ["thermal=serious"], attached=False)
    spare = fleet.add("iphone-16-pro", attached=False)
    with lab(stack, tmp_path, fleet, "emulated-lab") as running:
        # Only the faulty phones can claim (the others are gated or unplugged): both fail.
        wait_until(
            lambda: len(query("SELECT id FROM runs WHERE attempts = 1 AND state = 'queued'")) == 2,
            "both first attempts have failed",
            state=lambda: sweep_state(running.client, running.sweep_id),
        )
        fleet.usbmuxd.attach(hot.udid)
        fleet.usbmuxd.attach(spare.udid)
        finished = wait_for_sweep(running.client, running.sweep_id, timeout_s=240).model_dump(
            mode="json"
        )
        wait_until(
            lambda: (
                device_status()[hot.udid][0].startswith("cooling: thermal serious")
                and device_status()[spare.udid][0] == "ready"
            ),
            "the hot phone reports it is cooling and the spare is idle again",
            timeout_s=30,
        )
        statuses = device_status()

    assert finished["state"] == "completed", finished
    runs = {run["device_class"]: run for run in finished["runs"]}
    assert runs["iphone-17-pro"]["device_udid"] == hot.udid
    assert runs["iphone-16-pro"]["device_udid"] == spare.udid
    assert all(run["state"] == "succeeded" and run["attempts"] == 2 for run in runs.values())
    assert all(run["driver"] == "emulated" and run["simulated"] for run in runs.values())
    unplug_reason = " | ".join(run_reasons(runs["iphone-17-pro"]["id"]))
    assert f"device {unplugs.udid} was disconnected while pushing the model" in unplug_reason
    lock_reason = " | ".join(run_reasons(runs["iphone-16-pro"]["id"]))
    assert f"device {locks.udid} refused to launch the harness: The request to open" in lock_reason
    # every prompt stored once, none lost
    assert table_counts()["prompt_results"] == 2 * PROMPTS
    per_run = query("SELECT run_id, count(*) AS n FROM prompt_results GROUP BY run_id")
    assert sorted(row.n for row in per_run) == [PROMPTS, PROMPTS]
    # what the fleet page shows
    assert statuses[unplugs.udid] == ("disconnected", False)
    assert statuses[locks.udid] == ("locked", True)
    assert statuses[flat.udid] == ("low battery: 10% and not charging", True)
    assert statuses[no_developer_mode.udid] == ("developer mode off", True)
    assert statuses[spare.udid] == ("ready", True)


def test_the_agent_process_serves_emulated_iphones_from_the_command_line(stack: Stack) -> None:
    stack.start_agent(
        ["iphone-16-pro", "iphone-17-pro"],
        "--driver", "emulated",
        "--emulated-fault", "1=disconnect-mid-push",
        "--emulated-tokens", "off",
        "--poll-interval", "0.2",
        "--device-hold", "1",
        "--health-interval", "0.5",
    )  # fmt: skip
    with DecodebenchClient(stack.server_url, stack.tokens["user"]) as client:
        sweep = client.submit_sweep(
            {
                "model": "tiny-gqa",
                "variants": [
                    {"attention": "repeat_kv", "context": 128},
                    {"attention": "folded", "context": 128},
                ],
                "devices": ["iphone-16-pro", "iphone-17-pro"],
                "prompts": PROMPTS,
                "decode_tokens": 4,
            }
        )
        finished = finish(stack, client, sweep.id)

    assert finished["state"] == "completed", finished
    attempts = sorted(run["attempts"] for run in finished["runs"])
    assert attempts == [1, 1, 1, 2]  # the one pushed to when the cable was pulled, retried
    retried = next(run for run in finished["runs"] if run["attempts"] == 2)
    assert retried["device_class"] == "iphone-17-pro"
    assert any(
        "was disconnected while pushing the model" in reason
        for reason in run_reasons(retried["id"])
    )
    assert all(run["driver"] == "emulated" and run["simulated"] for run in finished["runs"])
    assert table_counts()["prompt_results"] == 4 * PROMPTS
    rows = {(row["device_class"], row["variant"]): row for row in finished["results"]}
    for device_class in ("iphone-16-pro", "iphone-17-pro"):
        assert rows[(device_class, "folded-ctx128-fp16")]["speedup_vs_first"] > 1.0
