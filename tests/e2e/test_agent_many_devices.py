"""One agent process with 40 simulated phones against a server process: idle, its devices wait
as asyncio tasks (not a blocked thread each); busy, their runs overlap instead of queueing
behind one another."""

from __future__ import annotations

import os
import time

import httpx
import psutil

from agent.main import CALL_THREADS
from scripts.stack import Stack
from scripts.standins import complete_builds, moving, time_scale_for
from tests.support.api import bearer
from tests.support.services import query

DEVICES = 40
DEVICE_CLASS = "iphone-17-pro"
PROMPTS, DECODE_TOKENS, BYTES_PER_TOKEN = 2, 8, 50_000_000
RUN_S = 2.0
SWEEP = {
    "model": "tiny-gqa",
    "variants": [{"attention": "folded", "context": 128 + 64 * i} for i in range(4)],
    "devices": [DEVICE_CLASS],
    "prompts": PROMPTS,
    "decode_tokens": DECODE_TOKENS,
    "repetitions": DEVICES // 4,
}


def wait_for(condition, timeout_s: float, stack: Stack, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        stack.check_alive()
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_forty_idle_devices_hold_no_thread_each_and_busy_ones_run_together(stack: Stack) -> None:
    scale = time_scale_for(RUN_S, DEVICE_CLASS, PROMPTS, DECODE_TOKENS, BYTES_PER_TOKEN)
    stack.start_agent(
        [DEVICE_CLASS] * DEVICES,
        "--time-scale", f"{scale:.6g}", "--noise-scale", "0", "--claim-wait", "30",
    )  # fmt: skip
    agent = psutil.Process(stack.processes["agent"].pid)
    ready = "SELECT count(*) FROM devices WHERE connected AND status = 'ready'"
    wait_for(lambda: query(ready)[0][0] == DEVICES, 60, stack, "the devices to register")
    time.sleep(2)  # every device's first claim is now a long poll

    # Idle: a long poll each, awaited by one event loop; the threads are the process's own (main,
    # heartbeat, the loop's and its resolver's, at most min(32, cores + 4)) and the pool shared
    # by short calls between runs, not one per device.
    own = 3 + min(32, (os.cpu_count() or 1) + 4)
    threads = agent.num_threads()
    assert threads <= CALL_THREADS + own and threads < DEVICES, threads

    with httpx.Client(base_url=stack.server_url, timeout=60) as client:
        sweep = client.post("/api/v1/sweeps", json=SWEEP, headers=bearer(stack.tokens["user"]))
        assert sweep.status_code == 201, sweep.text
        complete_builds(
            client, sweep.json()["builds"], stack.tokens["worker"], moving(BYTES_PER_TOKEN)
        )
    sweep_id = sweep.json()["id"]
    state = f"SELECT state FROM sweeps WHERE id = {sweep_id}"
    wait_for(lambda: query(state)[0][0] in ("completed", "failed"), 120, stack, "the sweep")
    assert query(state)[0][0] == "completed"

    spans = query(
        "SELECT extract(epoch FROM started_at), extract(epoch FROM finished_at) FROM runs"
        f" WHERE sweep_id = {sweep_id} AND state = 'succeeded'"
    )
    assert len(spans) == DEVICES
    assert min(float(end - start) for start, end in spans) > RUN_S / 2  # the runs really slept
    # how many runs were in flight at once, at most
    events = sorted(
        [(float(start), 1) for start, _ in spans] + [(float(end), -1) for _, end in spans]
    )
    in_flight, most = 0, 0
    for _, change in events:
        in_flight += change
        most = max(most, in_flight)
    assert most >= DEVICES * 3 // 4, most  # one at a time per device, all devices together
    devices = query(f"SELECT count(DISTINCT device_udid) FROM runs WHERE sweep_id = {sweep_id}")
    assert devices[0][0] >= DEVICES * 3 // 4
