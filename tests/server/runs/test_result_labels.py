"""The server checks a result's labels against the device its agent registered."""

from __future__ import annotations

import pytest

from tests.support.api import bearer
from tests.support.services import query, table_counts
from tests.support.sweeps import DEVICE, result_for, submit


def claim(api, agent_token: str) -> dict:
    return api.post(
        "/api/v1/agents/claim", json={"device_udid": "SIM-0001"}, headers=bearer(agent_token)
    ).json()["run"]


@pytest.mark.parametrize(
    ("field", "value"), [("simulated", False), ("driver", "host"), ("driver", "pymobiledevice3")]
)
def test_simulated_device_cannot_upload_relabelled_results(
    api,
    ready_sweep,
    agent_token,
    field,
    value,
) -> None:
    run = claim(api, agent_token)
    relabelled = {**result_for(range(3), 50.0), field: value}
    response = api.post(
        f"/api/v1/runs/{run['run_id']}/results", json=relabelled, headers=bearer(agent_token)
    )
    assert response.status_code == 422
    assert response.json()["detail"].startswith(f"{field}:")
    assert table_counts()["prompt_results"] == 0
    honest = api.post(
        f"/api/v1/runs/{run['run_id']}/results",
        json=result_for(range(3), 50.0),
        headers=bearer(agent_token),
    )
    assert honest.json()["state"] == "succeeded"


@pytest.mark.parametrize("driver", ["simulated", "emulated"])
def test_fake_device_cannot_register_as_measured(api, agent_token, driver) -> None:
    device = {**DEVICE, "driver": driver, "simulated": False}
    response = api.post(
        "/api/v1/agents/register",
        json={"name": "host-1", "devices": [device]},
        headers=bearer(agent_token),
    )
    assert response.status_code == 422
    assert "simulated" in response.json()["detail"] and driver in response.json()["detail"]
    assert table_counts()["devices"] == 0 and table_counts()["agents"] == 0


def test_host_device_may_register_as_measured(api, user_token, worker_token, agent_token) -> None:
    """A host device (a Mac timing the package itself) registers with ``simulated: false``: the
    fleet lists it as measured, and its results, labelled so, make a measured sweep."""
    device = {**DEVICE, "driver": "host", "simulated": False}
    response = api.post(
        "/api/v1/agents/register",
        json={"name": "host-1", "devices": [device]},
        headers=bearer(agent_token),
    )
    assert response.status_code == 200, response.text

    listed = api.get("/api/v1/devices", headers=bearer(user_token)).json()
    assert [(d["udid"], d["driver"], d["simulated"]) for d in listed] == [
        (DEVICE["udid"], "host", False)
    ]
    assert listed[0]["agent_id"] == response.json()["agent_id"]
    assert query("SELECT driver, simulated FROM devices") == [("host", False)]

    sweep_id = submit(api, user_token, worker_token)
    run = claim(api, agent_token)
    measured = {**result_for(range(3), 50.0), "driver": "host", "simulated": False}
    stored = api.post(
        f"/api/v1/runs/{run['run_id']}/results", json=measured, headers=bearer(agent_token)
    )
    assert stored.json()["state"] == "succeeded", stored.text
    assert (
        api.get(f"/api/v1/sweeps/{sweep_id}", headers=bearer(user_token)).json()["simulated"]
        is False
    )
