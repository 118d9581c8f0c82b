"""Build tasks reach the real Redis broker only after the sweep's transaction commits."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta

import pytest
import redis
from sqlalchemy import text

from decodebench.broker import BUILD_QUEUE, BUILD_TASK
from tests.support.api import bearer
from tests.support.services import REDIS_URL, table_counts

SWEEP = {
    "model": "tiny-gqa",
    "variants": [{"attention": "repeat_kv"}, {"attention": "folded"}],
    "devices": ["iphone-17-pro"],
}


@pytest.fixture
def broker():
    connection = redis.Redis.from_url(REDIS_URL)
    connection.flushdb()
    yield connection
    connection.flushdb()


def queued_build_ids(broker: redis.Redis) -> list[int]:
    ids = []
    for raw in broker.lrange(BUILD_QUEUE, 0, -1):
        message = json.loads(raw)
        assert message["headers"]["task"] == BUILD_TASK
        args, _kwargs, _embed = json.loads(base64.b64decode(message["body"]))
        ids.append(args[0])
    return sorted(ids)


def test_new_builds_are_enqueued_once(api, user_token, broker) -> None:
    sweep = api.post("/api/v1/sweeps", json=SWEEP, headers=bearer(user_token)).json()
    assert queued_build_ids(broker) == sorted(build["id"] for build in sweep["builds"])
    api.post("/api/v1/sweeps", json=SWEEP, headers=bearer(user_token))  # same builds: no new task
    assert len(queued_build_ids(broker)) == 2


def test_nothing_is_enqueued_when_the_transaction_rolls_back(
    api, user_token, broker, monkeypatch
) -> None:
    from server.sweeps import service

    def explode(*args, **kwargs):
        raise RuntimeError("database went away mid-request")

    monkeypatch.setattr(service, "refresh_sweep_state", explode)
    with pytest.raises(RuntimeError):
        api.post("/api/v1/sweeps", json=SWEEP, headers=bearer(user_token))
    assert queued_build_ids(broker) == []
    assert table_counts()["builds"] == 0


def test_reconciler_resends_builds_whose_message_was_lost(
    api, user_token, worker_token, broker
) -> None:
    from server.db import get_engine

    sweep = api.post("/api/v1/sweeps", json=SWEEP, headers=bearer(user_token)).json()
    broker.flushdb()  # the broker lost its messages
    fresh = api.post("/api/v1/builds/reconcile", headers=bearer(worker_token)).json()
    assert fresh == {"reenqueued": []}  # too recent to call lost
    with get_engine().begin() as connection:
        connection.execute(
            text("UPDATE builds SET updated_at = :old"),
            {"old": datetime.now(UTC) - timedelta(minutes=5)},
        )
    stale = api.post("/api/v1/builds/reconcile", headers=bearer(worker_token)).json()
    expected = sorted(build["id"] for build in sweep["builds"])
    assert sorted(stale["reenqueued"]) == expected
    assert queued_build_ids(broker) == expected
