"""A sweep on emulated iPhones through DVT, with the real server, worker, Postgres and Redis.

One phone reports iOS 16 (DVT over lockdown after the agent mounts the classic developer disk
image), one iOS 18 (tunneld → RemoteServiceDiscovery → DVT after the personalized image).
Four others each break one way — the disk image mount refused, the launch denied (untrusted
developer profile), the tunnel gone mid-run, the app killed by iOS — and each fails its run with
the reason, holds the device with a status whose fix is in the inventory, and the run is retried
on another phone with every prompt stored exactly once.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.doctor import largest_queued_model
from agent.drivers.fixes import DDI_NOT_MOUNTED, KILLED_BY_IOS, NO_TUNNEL, PROFILE_UNTRUSTED
from decodebench.client import DecodebenchClient
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


@pytest.fixture
def stack(worker_stack: Stack) -> Stack:
    """The same real stack as the emulated agent's tests: server, worker, Postgres, Redis."""
    return worker_stack


pytestmark = pytest.mark.slow


def test_dvt_faults_fail_their_runs_and_the_sweep_completes_on_ios_16_and_18(
    stack: Stack, tmp_path: Path
) -> None:
    fleet = EmulatedFleet(tmp_path / "devices", tokens="off", slow_s=8.0)
    refused = fleet.add("iphone-16-pro", ["ios=16.7.10", "ddi-mount-refused"])
    untrusted = fleet.add("iphone-16-pro", ["untrusted-profile"])
    tunnel_drops = fleet.add("iphone-17-pro", ["tunnel-drop", "slow"])
    killed = fleet.add("iphone-17-pro", ["killed-by-os"])
    ios16 = fleet.add("iphone-16-pro", ["ios=16.7.10"], attached=False)
    ios18 = fleet.add("iphone-17-pro", ["ios=18.6.2"], attached=False)
    with lab(stack, tmp_path, fleet, "dvt-lab") as running:
        # Only broken phones are attached: each run fails on both of its class's phones.
        wait_until(
            lambda: len(query("SELECT id FROM runs WHERE attempts = 2 AND state = 'queued'")) == 2,
            "every broken phone has failed a run",
            state=lambda: sweep_state(running.client, running.sweep_id),
        )
        # The server hears of a failure a moment before the agent holds the phone: wait for
        # the agent's inventory to show every broken phone held.
        held = {
            refused.udid: DDI_NOT_MOUNTED,
            untrusted.udid: PROFILE_UNTRUSTED,
            tunnel_drops.udid: NO_TUNNEL,
            killed.udid: KILLED_BY_IOS,
        }
        wait_until(
            lambda: all(
                info.status == held[info.udid]
                for info in running.agent.inventory()
                if info.udid in held
            ),
            "the agent holds every broken phone",
            timeout_s=10,
        )
        inventory = {info.udid: info for info in running.agent.inventory()}
        largest, unknown = largest_queued_model(running.settings, stack.tokens["user"])
        fleet.usbmuxd.attach(ios16.udid)
        fleet.usbmuxd.attach(ios18.udid)
        finished = finish(stack, running.client, running.sweep_id, timeout_s=240)
        # Heartbeats are rate-limited: the phones that ran the last runs say ready shortly after.
        wait_until(
            lambda: device_status()[ios16.udid][0] == device_status()[ios18.udid][0] == "ready",
            "the phones that finished the sweep report ready again",
            timeout_s=30,
        )
        statuses = device_status()

    assert finished["state"] == "completed", finished
    runs = {run["device_class"]: run for run in finished["runs"]}
    assert runs["iphone-16-pro"]["device_udid"] == ios16.udid
    assert runs["iphone-17-pro"]["device_udid"] == ios18.udid
    assert all(run["state"] == "succeeded" and run["attempts"] == 3 for run in runs.values())
    reasons = " | ".join(
        run_reasons(runs["iphone-16-pro"]["id"]) + run_reasons(runs["iphone-17-pro"]["id"])
    )
    assert f"the developer disk image is not mounted on device {refused.udid}" in reasons
    assert f"device {untrusted.udid} denied the launch" in reasons
    assert f"has no tunnel to device {tunnel_drops.udid}" in reasons
    assert "the harness exited without finishing the run (killed (SIGKILL" in reasons
    # every prompt stored once, none lost
    assert table_counts()["prompt_results"] == 2 * PROMPTS
    per_run = query("SELECT run_id, count(*) AS n FROM prompt_results GROUP BY run_id")
    assert sorted(row.n for row in per_run) == [PROMPTS, PROMPTS]
    # each broken phone is held, not ready, with its fix in the inventory sent to the server
    for udid, status in held.items():
        assert statuses[udid][0] == status, statuses
        fixes = {check.name: check.fix for check in inventory[udid].failed_checks}
        assert fixes.get(status), inventory[udid]
    assert statuses[ios16.udid][0] == statuses[ios18.udid][0] == "ready"
    # doctor sizes the queue from the server: the running sweep's build
    (build,) = finished["builds"]
    with DecodebenchClient(stack.server_url, stack.tokens["user"]) as client:
        report = client.get_build(build["id"]).report
    assert report is not None
    assert (largest, unknown) == (report.analysis.weight_file_bytes, "")
    assert largest > 0
