"""An agent thread serving emulated iPhones against the real server and worker processes, a sweep
submitted for it, and reading back what became of the sweep, its runs and its devices."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import text

from agent.config import AgentSettings
from agent.drivers.emulated import driver_for_fleet
from agent.main import Agent
from decodebench.client import DecodebenchClient
from emulator.fleet import EmulatedFleet
from scripts.stack import Stack

PROMPTS = 3


def query(sql: str, **params: Any) -> list[Any]:
    from server.db import get_engine

    with get_engine().connect() as connection:
        return list(connection.execute(text(sql), params))


def wait_until(
    condition: Callable[[], bool],
    what: str,
    timeout_s: float = 240.0,
    state: Callable[[], str] = lambda: "",
) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}; {state()}"
        time.sleep(0.2)


@dataclass
class Lab:
    agent: Agent
    settings: AgentSettings
    client: DecodebenchClient  # the user's
    sweep_id: int


@contextmanager
def lab(stack: Stack, tmp_path: Path, fleet: EmulatedFleet, name: str) -> Iterator[Lab]:
    """An agent thread serving ``fleet`` through the emulated driver, and a sweep of one folded
    variant on both device classes submitted for it; everything stops on the way out."""
    fleet.start()
    driver = driver_for_fleet(fleet, tmp_path / "agent", poll_interval_s=0.05)
    settings = AgentSettings(
        server_url=stack.server_url,
        token=stack.tokens["agent"],
        name=name,
        driver="emulated",
        work_dir=tmp_path / "agent",
        poll_interval_s=0.2,
        heartbeat_interval_s=1.0,
        health_interval_s=0.5,
        device_hold_s=120,
    )
    with DecodebenchClient(stack.server_url, stack.tokens["agent"]) as agent_client:
        agent = Agent(settings, agent_client, driver)
        serving = threading.Thread(target=agent.run, name="agent")
        serving.start()
        try:
            with DecodebenchClient(stack.server_url, stack.tokens["user"]) as client:
                sweep = client.submit_sweep(
                    {
                        "model": "tiny-gqa",
                        "variants": [{"attention": "folded", "context": 128}],
                        "devices": ["iphone-16-pro", "iphone-17-pro"],
                        "prompts": PROMPTS,
                        "decode_tokens": 4,
                    }
                )
                yield Lab(agent, settings, client, sweep.id)
        finally:
            agent.request_stop("test finished")
            serving.join(timeout=60)
            driver.close()
            fleet.stop()


def sweep_state(client: DecodebenchClient, sweep_id: int) -> str:
    """What the sweep is doing, for a failure message (a failed build stops every run)."""
    sweep = client.get_sweep(sweep_id).model_dump(mode="json")
    builds = [(build["label"], build["state"], build.get("error")) for build in sweep["builds"]]
    runs = [
        (run["id"], run["state"], run["attempts"], run["failure_reason"]) for run in sweep["runs"]
    ]
    return f"sweep {sweep['state']}, builds {builds}, runs {runs}"


def finish(
    stack: Stack, client: DecodebenchClient, sweep_id: int, timeout_s: float = 300
) -> dict[str, Any]:
    """The finished sweep; fails early, with the log, if a role process dies."""
    deadline = time.monotonic() + timeout_s
    while True:
        stack.check_alive()
        sweep = client.get_sweep(sweep_id)
        if sweep.state in ("completed", "failed"):
            return sweep.model_dump(mode="json")
        assert time.monotonic() < deadline, (
            f"after {timeout_s:g} s: {sweep_state(client, sweep_id)}"
        )
        time.sleep(0.5)


def run_reasons(run_id: int) -> list[str]:
    rows = query(
        "SELECT reason FROM transitions WHERE entity = 'run' AND entity_id = :id ORDER BY id",
        id=run_id,
    )
    return [row.reason for row in rows]


def device_status() -> dict[str, tuple[str, bool]]:
    """Each device's status with its particulars, as the fleet page shows it."""
    return {
        row.udid: (f"{row.status}: {row.status_detail}" if row.status_detail else row.status,
                   row.connected)
        for row in query("SELECT udid, status, status_detail, connected FROM devices")
    }  # fmt: skip
