"""The server checks a result's labels against the device its agent registered."""

from __future__ import annotations

import pytest

from tests.support.api import bearer
from tests.support.services import table_counts
from tests.support.sweeps import DEVICE, result_for


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


def test_host_device_may_register_as_measured(api, agent_token) -> None:
    device = {**DEVICE, "driver": "host", "simulated": False}
    response = api.post(
        "/api/v1/agents/register",
        json={"name": "host-1", "devices": [device]},
        headers=bearer(agent_token),
    )
    assert response.status_code == 200
