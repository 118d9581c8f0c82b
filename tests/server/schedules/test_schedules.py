"""Nightly schedules end to end against a real server process, PostgreSQL and Redis, with the
stand-in worker and agent of tests/support/stand_ins.py acting over HTTP. Nights are driven by the
tick endpoint (the one beat's task calls) with a settable clock, so nothing waits for a minute."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import signal
import threading
import time
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from scripts.stack import Stack
from tests.support.api import bearer
from tests.support.schedules import FIRST_NIGHT, NIGHTLY_SPEC
from tests.support.stand_ins import StandIns

SECRET = "nightly-webhook-secret-0123"


@pytest.fixture(autouse=True)
def _no_schedules(db: None) -> None:
    """The shared fixtures truncate the sweep tables; schedules are this module's to clear."""
    from sqlalchemy import text

    from server.db import get_engine

    with get_engine().begin() as connection:
        connection.execute(text("TRUNCATE schedules RESTART IDENTITY CASCADE"))


class Receiver(ThreadingHTTPServer):
    """A webhook endpoint on loopback that keeps what it received."""

    def __init__(self, failures: int = 0) -> None:
        self.received: list[tuple[dict[str, str], bytes]] = []
        self.failures = failures
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.received.append((dict(self.headers), body))
                failing = len(receiver.received) <= receiver.failures
                self.send_response(503 if failing else 204)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/hook"


def _schedule(stack: Stack, **overrides: object) -> dict:
    body = {"name": "nightly-tiny", "spec": NIGHTLY_SPEC, "cron": "0 2 * * *",
            "timezone": "UTC", **overrides}  # fmt: skip
    response = httpx.post(f"{stack.server_url}/api/v1/schedules", json=body,
                          headers=bearer(stack.tokens["user"]))  # fmt: skip
    assert response.status_code == 201, response.text
    return response.json()


def _tick(stack: Stack, now: datetime) -> dict:
    response = httpx.post(f"{stack.server_url}/api/v1/schedules/tick", json={"now": now.isoformat()},
                          headers=bearer(stack.tokens["worker"]), timeout=60)  # fmt: skip
    assert response.status_code == 200, response.text
    return response.json()


def _wait_finished(stack: Stack, sweep_id: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = httpx.get(f"{stack.server_url}/api/v1/sweeps/{sweep_id}",
                          headers=bearer(stack.tokens["user"])).json()["state"]  # fmt: skip
        if state in ("completed", "failed"):
            assert state == "completed"
            return
        time.sleep(0.2)
    raise AssertionError(f"sweep {sweep_id} did not finish")


def _night(stack: Stack, night: int) -> dict:
    """Fire night ``night`` by the clock, let the stand-ins measure it, and judge it."""
    now = FIRST_NIGHT + timedelta(days=night)
    fired = _tick(stack, now)["fired"]
    assert len(fired) == 1
    firings = _get(stack, "/api/v1/schedules/1/firings")
    _wait_finished(stack, firings[-1]["sweep_id"])
    return _tick(stack, now + timedelta(minutes=5))


def _get(stack: Stack, path: str, **params: object):
    response = httpx.get(f"{stack.server_url}{path}", params=params,
                         headers=bearer(stack.tokens["user"]))  # fmt: skip
    assert response.status_code == 200, response.text
    return response.json()


def _restart_server(stack: Stack, **settings: str) -> None:
    server = stack.processes.pop("server")
    os.killpg(server.pid, signal.SIGTERM)
    server.wait(timeout=20)
    stack.start_server(**settings)


def test_an_injected_slowdown_is_confirmed_with_what_changed_and_one_signed_webhook(
    stack: Stack,
) -> None:
    receiver = Receiver()
    schedule = _schedule(stack, webhook_url=receiver.url, webhook_secret=SECRET, min_effect=0.03)
    stand_ins = StandIns(stack, folded_speed=1.0)
    stand_ins.start()
    try:
        for night in range(8):
            assert _night(stack, night)["alerts"] == []  # no change, nothing raised
        stand_ins.stopped.set()
        stand_ins.join(timeout=10)
        # Night 9: a new coremltools is deployed and decode is 8% slower.
        _restart_server(stack, DECODEBENCH_TOOLCHAIN_COREMLTOOLS="9.1")
        stand_ins = StandIns(stack, folded_speed=0.92)
        stand_ins.start()
        suspected = _night(stack, 8)["alerts"]
        assert len(suspected) == 1
        alert = _get(stack, "/api/v1/alerts")[0]
        assert alert["status"] == "suspected" and alert["direction"] == "regression"
        assert receiver.received == []  # nobody is told before the re-run
        _wait_finished(stack, alert["confirmation_sweep_id"])
        _tick(stack, FIRST_NIGHT + timedelta(days=8, minutes=10))
    finally:
        stand_ins.stopped.set()
        stand_ins.join(timeout=10)

    alert = _get(stack, "/api/v1/alerts", status="confirmed")[0]
    nights = _get(stack, f"/api/v1/schedules/{schedule['id']}/firings")
    assert alert["last_good_sweep_id"] == nights[7]["sweep_id"]
    assert alert["first_bad_sweep_id"] == nights[8]["sweep_id"]
    ratio = alert["ratio"]
    assert ratio["verdict"] == "worse" and ratio["ci_low"] < 0.92 < ratio["ci_high"] < 0.97
    changed = {change["field"]: change for change in alert["changed"]}
    coremltools = changed["builds.folded-ctx512-fp16.toolchain.coremltools"]
    assert (coremltools["before"], coremltools["after"]) == ("9.0", "9.1")
    good_build = nights[7]["context"]["builds"]["folded-ctx512-fp16"]["build_id"]
    bad_build = nights[8]["context"]["builds"]["folded-ctx512-fp16"]["build_id"]
    assert alert["build_diff"] == f"/api/v1/builds/{good_build}/diff/{bad_build}"
    rerun = _get(stack, f"/api/v1/sweeps/{alert['confirmation_sweep_id']}")
    assert [build["id"] for build in rerun["builds"]] == [bad_build]  # the same builds

    series = _get(stack, f"/api/v1/schedules/{schedule['id']}/series")
    assert len(series) == 1 and len(series[0]["values"]) == 9
    assert series[0]["alerts"][0]["status"] == "confirmed"

    deliver = httpx.post(f"{stack.server_url}/api/v1/schedules/webhooks/deliver",
                         headers=bearer(stack.tokens["worker"]))  # fmt: skip
    assert deliver.json() == {"attempted": 1, "delivered": 1}
    again = httpx.post(f"{stack.server_url}/api/v1/schedules/webhooks/deliver",
                       headers=bearer(stack.tokens["worker"]))  # fmt: skip
    assert again.json() == {"attempted": 0, "delivered": 0}
    assert len(receiver.received) == 1
    headers, body = receiver.received[0]
    expected = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    assert hmac.compare_digest(headers["X-Decodebench-Signature"], expected)
    payload = json.loads(body)
    assert payload["event"] == "regression.confirmed"
    assert payload["alert"]["build_diff"].endswith(alert["build_diff"])
    receiver.shutdown()


def test_two_racing_ticks_fire_a_due_night_once_and_a_missed_week_once(stack: Stack) -> None:
    _schedule(stack)
    due = FIRST_NIGHT + timedelta(days=3)
    results: list[dict] = []
    racers = [threading.Thread(target=lambda: results.append(_tick(stack, due))) for _ in range(2)]
    for racer in racers:
        racer.start()
    for racer in racers:
        racer.join()
    assert sorted(len(result["fired"]) for result in results) == [0, 1]
    # The beat was down for a week: the latest due night runs once, not seven times.
    assert len(_tick(stack, due + timedelta(days=7))["fired"]) == 1
    assert _tick(stack, due + timedelta(days=7, minutes=1))["fired"] == []
    firings = _get(stack, "/api/v1/schedules/1/firings")
    assert [f["due_at"][:10] for f in firings] == ["2027-01-04", "2027-01-11"]
    assert len(_get(stack, "/api/v1/sweeps")) == 2
    # Paused: nothing fires; run-now still does.
    user = bearer(stack.tokens["user"])
    assert (
        httpx.post(f"{stack.server_url}/api/v1/schedules/1/pause", headers=user).json()["enabled"]
        is False
    )
    assert _tick(stack, due + timedelta(days=8))["fired"] == []
    now = httpx.post(f"{stack.server_url}/api/v1/schedules/1/run-now", json={}, headers=user)
    assert now.status_code == 201 and now.json()["trigger"] == "run-now"


@pytest.mark.parametrize(
    ("override", "field"),
    [({"cron": "61 2 * * *"}, "cron"), ({"timezone": "Mars/Olympus"}, "timezone"),
     ({"min_effect": 0.7}, "min_effect"), ({"min_effect": 0.0}, "min_effect"),
     ({"budget": 1}, "budget"), ({"budget": 0}, "budget"), ({"budget": 257}, "budget"),
     ({"budget": "8"}, "budget")],
)  # fmt: skip
def test_bad_schedules_are_refused_with_the_field_named(
    api, user_token: str, worker_token: str, override: dict, field: str
) -> None:
    body = {"name": "bad", "spec": NIGHTLY_SPEC, "cron": "0 2 * * *", **override}
    refused = api.post("/api/v1/schedules", json=body, headers=bearer(user_token))
    assert refused.status_code == 422
    assert refused.json()["detail"][0]["loc"] == ["body", field]
    assert api.get("/api/v1/schedules", headers=bearer(user_token)).json() == []
    tick = api.post("/api/v1/schedules/tick", json={}, headers=bearer(worker_token))
    assert tick.json()["fired"] == []


def test_the_cli_manages_schedules_and_beats_task_ticks(
    stack: Stack, tmp_path, capsys, monkeypatch
) -> None:
    from decodebench.cli import main

    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(NIGHTLY_SPEC))
    cli = ["schedule", "--server", stack.server_url, "--token", stack.tokens["user"]]
    create = [*cli, "create", "--spec", str(spec), "--cron", "30 1 * * *"]
    assert main([*create, "cli-nightly", "--timezone", "Europe/Paris"]) == 0
    assert main([*create, "bad-zone", "--timezone", "Nowhere/Land"]) == 2
    assert "timezone" in capsys.readouterr().err
    assert main([*cli, "pause", "1"]) == 0
    assert main([*cli, "list"]) == 0
    listed = capsys.readouterr().out
    assert "cli-nightly" in listed and "Europe/Paris" in listed and "paused" in listed
    assert "bad-zone" not in listed
    assert main([*cli, "run-now", "1"]) == 0
    assert "fired schedule 1: sweep 1" in capsys.readouterr().out

    # The task beat runs (in this process): it ticks and delivers over HTTP as a worker.
    monkeypatch.setenv("DECODEBENCH_WORKER_TOKEN", stack.tokens["worker"])
    import worker.app
    from worker.config import WorkerSettings

    monkeypatch.setattr(worker.app, "settings", WorkerSettings(server_url=stack.server_url))
    result = worker.app.schedule_tick_task.apply().get()
    assert result == {"fired": [], "completed": [], "alerts": [], "webhooks_delivered": 0}


def test_a_failed_delivery_is_logged_and_retried_after_a_back_off(
    api, user_token: str, worker_token: str
) -> None:
    from sqlalchemy import select, update

    from decodebench.contracts.schedules import WebhookEvent
    from server.db import get_sessionmaker
    from server.models import Schedule, WebhookAttempt, WebhookDelivery
    from server.schedules.webhooks import notify

    receiver = Receiver(failures=1)
    body = {"name": "hooked", "spec": NIGHTLY_SPEC, "cron": "0 2 * * *",
            "webhook_url": receiver.url, "webhook_secret": SECRET}  # fmt: skip
    assert api.post("/api/v1/schedules", json=body, headers=bearer(user_token)).status_code == 201
    with get_sessionmaker().begin() as session:
        schedule = session.scalars(select(Schedule)).one()
        notify(session, schedule, WebhookEvent.nightly_failed, {"event": "nightly.failed"})

    def deliver() -> dict:
        return api.post("/api/v1/schedules/webhooks/deliver", headers=bearer(worker_token)).json()

    assert deliver() == {"attempted": 1, "delivered": 0}
    assert deliver() == {"attempted": 0, "delivered": 0}  # backing off
    with get_sessionmaker().begin() as session:  # let the back-off pass
        session.execute(
            update(WebhookDelivery).values(next_attempt_at=datetime(2000, 1, 1, tzinfo=UTC))
        )
    assert deliver() == {"attempted": 1, "delivered": 1}
    with get_sessionmaker()() as session:
        attempts = session.scalars(select(WebhookAttempt).order_by(WebhookAttempt.id)).all()
        assert [(a.attempt, a.status_code) for a in attempts] == [(1, 503), (2, 204)]
        assert session.scalars(select(WebhookDelivery)).one().state == "delivered"
    ids = {headers["X-Decodebench-Delivery"] for headers, _ in receiver.received}
    assert len(receiver.received) == 2 and len(ids) == 1  # the same delivery, retried
    receiver.shutdown()


def test_a_second_firing_of_a_due_time_waits_for_the_first_and_inserts_nothing(
    api, user_token: str
) -> None:
    """The unique (schedule, due time) row, exercised with the first transaction still open:
    the second one blocks on it, then finds the due time taken and starts no sweep."""
    from sqlalchemy import func, select

    from server.db import get_sessionmaker
    from server.models import Schedule, Sweep
    from server.schedules.service import fire

    body = {"name": "raced", "spec": NIGHTLY_SPEC, "cron": "0 2 * * *"}
    assert api.post("/api/v1/schedules", json=body, headers=bearer(user_token)).status_code == 201
    due = FIRST_NIGHT.replace(minute=0)
    first, second = get_sessionmaker()(), get_sessionmaker()()
    outcome: list[object] = []
    try:
        assert fire(first, first.scalars(select(Schedule)).one(), due, "cron") is not None
        racer = threading.Thread(
            target=lambda: outcome.append(
                fire(second, second.scalars(select(Schedule)).one(), due, "cron")
            )
        )
        racer.start()
        racer.join(timeout=1)
        assert racer.is_alive()  # blocked on the first transaction's row
        first.commit()
        racer.join(timeout=10)
        assert outcome == [None]
        second.commit()
    finally:
        first.close()
        second.close()
    with get_sessionmaker()() as session:
        assert session.scalar(select(func.count()).select_from(Sweep)) == 1
