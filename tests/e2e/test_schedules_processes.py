"""A nightly schedule through every real process: the server, two Celery workers, two Celery
beat processes ticking every second, a simulated agent, PostgreSQL and Redis. Nothing is driven
by hand: the beats fire the due night, a worker builds it, the agent measures it and a later tick
judges it. The schedule is created as if a week ago (its row's ``created_at``), so last night's
02:00 is due at once instead of after a wait for the next cron minute."""

from __future__ import annotations

import time

import httpx
import pytest
from sqlalchemy import text

from scripts.stack import Stack
from tests.support.api import bearer
from tests.support.schedules import NIGHTLY_SPEC

pytestmark = pytest.mark.slow

BEATS = ("beat-a", "beat-b")
TICK_TASK_SENT = "Sending due task tick-nightly-schedules"


@pytest.fixture(autouse=True)
def _no_schedules(db: None) -> None:
    from server.db import get_engine

    with get_engine().begin() as connection:
        connection.execute(text("TRUNCATE schedules RESTART IDENTITY CASCADE"))


def _get(stack: Stack, path: str) -> list | dict:
    response = httpx.get(f"{stack.server_url}{path}", headers=bearer(stack.tokens["user"]))
    assert response.status_code == 200, response.text
    return response.json()


def _until(what: str, check, stack: Stack, timeout: float = 300):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        stack.check_alive()
        found = check()
        if found:
            return found
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def _ticks_sent(stack: Stack, beat: str) -> int:
    return (stack.var_dir / f"{beat}.log").read_text(errors="replace").count(TICK_TASK_SENT)


def test_two_beats_fire_a_due_night_once_and_the_worker_and_agent_complete_it(
    stack: Stack,
) -> None:
    body = {"name": "nightly-processes", "spec": NIGHTLY_SPEC, "cron": "0 2 * * *",
            "timezone": "UTC"}  # fmt: skip
    created = httpx.post(f"{stack.server_url}/api/v1/schedules", json=body,
                         headers=bearer(stack.tokens["user"]))  # fmt: skip
    assert created.status_code == 201, created.text
    schedule_id = created.json()["id"]
    from server.db import get_engine

    with get_engine().begin() as connection:
        connection.execute(
            text("UPDATE schedules SET created_at = now() - interval '7 days' WHERE id = :id"),
            {"id": schedule_id},
        )

    stack.start_worker()
    stack.start_worker(name="worker-2")  # two consumers, so two beats' ticks can race
    stack.start_agent(NIGHTLY_SPEC["devices"], "--time-scale", "0")
    for beat in BEATS:
        stack.start_beat(schedule_tick_interval_s=1.0, name=beat)

    firings_path = f"/api/v1/schedules/{schedule_id}/firings"
    firing = _until("the beats to fire the due night", lambda: _get(stack, firings_path), stack)[0]
    assert firing["trigger"] == "cron"
    sweep_path = f"/api/v1/sweeps/{firing['sweep_id']}"
    _until("the night's sweep to finish",
           lambda: _get(stack, sweep_path)["state"] in ("completed", "failed"), stack)  # fmt: skip
    sweep = _get(stack, sweep_path)
    assert sweep["state"] == "completed", sweep
    assert [build["state"] for build in sweep["builds"]] == ["succeeded"]
    assert all(row["simulated"] for row in sweep["results"])

    # A later tick judges the finished night: its context and values are recorded.
    judged = _until("a tick to judge the night",
                    lambda: [f for f in _get(stack, firings_path) if f["completed_at"]], stack)  # fmt: skip
    assert (
        judged[0]["context"]["builds"]["folded-ctx512-fp16"]["build_id"] == sweep["builds"][0]["id"]
    )

    # Both beats kept ticking all along (each sent the task several times since the night
    # fired); the due night is still one firing and one sweep.
    sent = {beat: _ticks_sent(stack, beat) for beat in BEATS}
    _until("each beat to send three more ticks",
           lambda: all(_ticks_sent(stack, beat) >= sent[beat] + 3 for beat in BEATS), stack, 60)  # fmt: skip
    assert len(_get(stack, firings_path)) == 1
    assert [s["id"] for s in _get(stack, "/api/v1/sweeps")] == [firing["sweep_id"]]
    assert _get(stack, "/api/v1/alerts") == []
