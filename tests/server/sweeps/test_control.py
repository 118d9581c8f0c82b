"""Cancelling a sweep, retrying a failed run, and runs no device can take: explained on the
page and failed with that reason after the configured wait."""

from __future__ import annotations

import pytest

from tests.support.api import bearer, complete_build
from tests.support.pages import page_csrf, ui_sign_in

SWEEP = {
    "model": "tiny-gqa",
    "variants": [{"attention": "repeat_kv", "context": 128}, {"attention": "folded", "context": 128}],
    "devices": ["iphone-15-pro"],
    "prompts": 2,
}  # fmt: skip
FIGURES = {"bytes_per_token": {"weights": 3 << 20, "kv_read": 1 << 20, "total": 4 << 20}}


@pytest.fixture
def queued_sweep(api, user_token: str, worker_token: str) -> dict:
    created = api.post("/api/v1/sweeps", json=SWEEP, headers=bearer(user_token)).json()
    for build in created["builds"]:
        complete_build(api, build, worker_token, FIGURES)
    return api.get(f"/api/v1/sweeps/{created['id']}", headers=bearer(user_token)).json()


def test_a_run_no_device_can_take_is_explained_then_failed_after_the_wait(
    api, queued_sweep, user_token
) -> None:
    from server.db import get_sessionmaker
    from server.sweeps.control import fail_unschedulable_runs

    assert {run["state"] for run in queued_sweep["runs"]} == {"queued"}
    ui_sign_in(api, user_token)
    page = api.get(f"/sweeps/{queued_sweep['id']}").text
    assert "no iPhone 15 Pro attached; never seen by any agent" in page
    assert 'id="bytes-chart"' in page and page.count('class="segment"') == 2 * 4

    with get_sessionmaker().begin() as session:
        assert fail_unschedulable_runs(session, wait_seconds=3600) == []
    with get_sessionmaker().begin() as session:
        failed = fail_unschedulable_runs(session, wait_seconds=0)
    assert sorted(failed) == sorted(run["id"] for run in queued_sweep["runs"])
    after = api.get(f"/api/v1/sweeps/{queued_sweep['id']}", headers=bearer(user_token)).json()
    assert after["state"] == "failed"
    reasons = {run["failure_reason"] for run in after["runs"]}
    assert reasons == {"no iPhone 15 Pro attached; never seen by any agent (waited 0 min)"}


def test_cancel_fails_the_runs_not_started_and_ends_the_sweep(
    api, queued_sweep, user_token
) -> None:
    url = f"/api/v1/sweeps/{queued_sweep['id']}/cancel"
    cancelled = api.post(url, headers=bearer(user_token))
    assert cancelled.status_code == 200, cancelled.text
    body = cancelled.json()
    assert body["state"] == "failed"
    assert {run["failure_reason"] for run in body["runs"]} == {"cancelled by ci"}
    assert api.post(url, headers=bearer(user_token)).status_code == 409


def test_cancel_through_the_page_and_retry_a_failed_run(api, queued_sweep, user_token) -> None:
    ui_sign_in(api, user_token)
    page = api.get(f"/sweeps/{queued_sweep['id']}").text
    assert 'id="cancel-sweep"' in page
    done = api.post(f"/sweeps/{queued_sweep['id']}/cancel", data={"csrf_token": page_csrf(page)})
    assert done.url.path == f"/sweeps/{queued_sweep['id']}"  # post/redirect/get
    assert 'id="cancel-sweep"' not in done.text and "cancelled by ci" in done.text

    run_id = queued_sweep["runs"][0]["id"]
    retried = api.post(
        f"/sweeps/{queued_sweep['id']}/runs/{run_id}/retry", data={"csrf_token": page_csrf(page)}
    )
    assert retried.status_code == 200
    detail = api.get(f"/api/v1/sweeps/{queued_sweep['id']}", headers=bearer(user_token)).json()
    run = next(run for run in detail["runs"] if run["id"] == run_id)
    assert (run["state"], run["attempts"], run["failure_reason"]) == ("queued", 0, None)
    assert detail["state"] == "running"
    again = api.post(
        f"/api/v1/sweeps/{queued_sweep['id']}/runs/{run_id}/retry", headers=bearer(user_token)
    )
    assert again.status_code == 409 and "only a failed run" in again.json()["detail"]


def test_the_live_fragment_is_the_changing_part_of_the_page(api, queued_sweep, user_token) -> None:
    ui_sign_in(api, user_token)
    fragment = api.get(f"/sweeps/{queued_sweep['id']}/live").text
    assert fragment.startswith("<h1>Sweep") and "<html" not in fragment
    page = api.get(f"/sweeps/{queued_sweep['id']}").text
    assert 'src="/static/sweep-live.js"' in page and 'http-equiv="refresh"' not in page


DEVICE = {
    "udid": "SIM-0015", "device_class": "iphone-15-pro", "product_type": "iPhone16,1",
    "os_version": "26.1", "driver": "simulated", "simulated": True,
}  # fmt: skip


def test_fleet_page_shows_current_runs_queues_failures_and_devices_gone(
    api, queued_sweep, user_token, agent_token
) -> None:
    agent = bearer(agent_token)
    registration = {"name": "host-1", "devices": [DEVICE]}
    assert api.post("/api/v1/agents/register", json=registration, headers=agent).is_success
    claimed = api.post("/api/v1/agents/claim", json={"device_udid": "SIM-0015"}, headers=agent)
    run_id = claimed.json()["run"]["run_id"]
    ui_sign_in(api, user_token)
    page = api.get("/devices").text
    row = page.split('data-udid="SIM-0015"')[1].split("</tr>")[0]
    assert f"run {run_id}" in row
    queue = page.split('data-device-class="iphone-15-pro"')[1].split("</tr>")[0]
    assert "<td>1</td>" in queue  # one run still queued, the device busy with the other
    assert 'id="none-gone"' in page

    api.post("/api/v1/agents/heartbeat", json={"devices": []}, headers=agent)
    page = api.get("/devices").text
    assert 'data-udid="SIM-0015"' in page.split('id="gone"')[1]
    sweep_page = api.get(f"/sweeps/{queued_sweep['id']}").text
    assert "no iPhone 15 Pro attached and ready; last seen" in sweep_page
    assert "(disconnected)" in sweep_page


def test_the_workers_reconcile_fails_the_runs_no_device_can_take(
    api, queued_sweep, user_token, worker_token, monkeypatch
) -> None:
    """Builds sit below sweeps and import none of them: the application wires the sweeps'
    step into the builds' reconcile, and a worker's periodic call runs it."""
    from server.config import get_settings

    monkeypatch.setenv("DECODEBENCH_UNSCHEDULABLE_WAIT_SECONDS", "0")
    get_settings.cache_clear()
    try:
        answered = api.post("/api/v1/builds/reconcile", headers=bearer(worker_token))
    finally:
        get_settings.cache_clear()
    assert answered.status_code == 200, answered.text
    after = api.get(f"/api/v1/sweeps/{queued_sweep['id']}", headers=bearer(user_token)).json()
    assert after["state"] == "failed"
    assert {run["state"] for run in after["runs"]} == {"failed"}
