"""Every leased kind (builds, doctor jobs) over the routes made once from its description: a
lease that runs out lets another worker take the work over at once, the first worker's reports
are refused from then on, and each kind's attempts are its own setting."""

from __future__ import annotations

import pytest

from server.config import get_settings
from tests.support.api import bearer
from tests.support.services import query

SWEEP = {
    "model": "tiny-gqa",
    "variants": [{"attention": "repeat_kv"}],
    "devices": ["iphone-17-pro"],
}
KINDS = {"builds": "builds", "doctor": "doctor_jobs"}  # URL prefix: table


def queued_build(api, user_token: str) -> int:
    sweep = api.post("/api/v1/sweeps", json=SWEEP, headers=bearer(user_token)).json()
    return sweep["builds"][0]["id"]


def queued_doctor_job(api, user_token: str) -> int:
    """A queued job written as submitting one would (no package needed: nothing runs it)."""
    (row,) = query(
        "INSERT INTO doctor_jobs (project_id, submitted_by, package, package_sha256, tokenizer,"
        " prompts, steps, devices, state, progress, attempts, created_at, updated_at)"
        " SELECT id, 'u', 'massive', :sha, 'smollm2-135m', 2, 4, '[\"iphone-17-pro\"]',"
        " 'queued', 0, 0, now(), now() FROM projects WHERE name = 'default' RETURNING id",
        sha="0" * 64,
    )
    return row[0]


def queued(api, user_token: str, prefix: str) -> int:
    return (
        queued_build(api, user_token) if prefix == "builds" else queued_doctor_job(api, user_token)
    )


def expire(table: str) -> None:
    query(f"UPDATE {table} SET lease_expires_at = now() - interval '1 second'")


@pytest.mark.parametrize("prefix", list(KINDS))
def test_a_lease_that_ran_out_lets_another_worker_take_the_work(
    api, user_token, worker_token, prefix
) -> None:
    work_id = queued(api, user_token, prefix)
    path, worker = f"/api/v1/{prefix}/{work_id}", bearer(worker_token)
    first = api.post(f"{path}/start", json={"worker": "w1"}, headers=worker).json()
    assert first["proceed"] and first["lease_seconds"] == 120.0
    # While w1 holds the lease a duplicate delivery is not redone.
    held = api.post(f"{path}/start", json={"worker": "w2"}, headers=worker).json()
    assert held == {"proceed": False, "state": first["state"], "lease": None, "lease_seconds": None}
    expire(KINDS[prefix])
    second = api.post(f"{path}/start", json={"worker": "w2"}, headers=worker).json()
    assert second["proceed"] and second["lease"] != first["lease"]
    late = {"lease": first["lease"], "stage": "still here", "fraction": 0.5}
    assert api.post(f"{path}/progress", json=late, headers=worker).status_code == 409
    assert (
        api.post(f"{path}/lease", json={"lease": first["lease"]}, headers=worker).status_code == 409
    )
    mine = {"lease": second["lease"], "stage": "converting", "fraction": 0.5}
    assert api.post(f"{path}/progress", json=mine, headers=worker).status_code == 204
    (row,) = query(
        f"SELECT worker, attempts, stage FROM {KINDS[prefix]} WHERE id = :id", id=work_id
    )
    assert row == ("w2", 2, "converting")


@pytest.mark.parametrize("prefix", list(KINDS))
def test_each_kind_s_attempts_and_lease_are_its_own_settings(
    api, user_token, worker_token, prefix, monkeypatch
) -> None:
    """One attempt and a 30 s lease for doctor jobs change nothing for builds (and back)."""
    settings = get_settings()
    other = "builds" if prefix == "doctor" else "doctor"
    own = "build" if prefix == "builds" else "doctor"
    monkeypatch.setattr(settings, f"max_{own}_attempts", 1)
    monkeypatch.setattr(settings, f"{own}_lease_seconds", 30.0)
    mine, theirs = queued(api, user_token, prefix), queued(api, user_token, other)
    worker = bearer(worker_token)
    started = {}
    for kind, work_id in ((prefix, mine), (other, theirs)):
        path = f"/api/v1/{kind}/{work_id}/start"
        started[kind] = api.post(path, json={"worker": "w1"}, headers=worker).json()
    assert started[prefix]["lease_seconds"] == 30.0
    assert started[other]["lease_seconds"] == 120.0
    expire(KINDS[prefix])
    expire(KINDS[other])
    assert api.post(f"/api/v1/{prefix}/reconcile", headers=worker).json() == {"reenqueued": []}
    assert api.post(f"/api/v1/{other}/reconcile", headers=worker).json() == {"reenqueued": [theirs]}
    ((state, error),) = query(f"SELECT state, error FROM {KINDS[prefix]} WHERE id = :id", id=mine)
    assert state == "failed" and "gave up after 1 attempts" in error
    ((state,),) = query(f"SELECT state FROM {KINDS[other]} WHERE id = :id", id=theirs)
    assert state == "queued"
