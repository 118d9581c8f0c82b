"""The server's side of a sweep, driven over HTTP as a worker and an agent would."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text

from tests.support.api import bearer
from tests.support.services import table_counts
from tests.support.sweeps import result_for


def test_sweep_runs_to_completion_with_simulated_label(
    api, ready_sweep, user_token, agent_token
) -> None:
    agent = bearer(agent_token)
    rates = {}
    for expected_rate in (50.0, 100.0):
        run = api.post(
            "/api/v1/agents/claim", json={"device_udid": "SIM-0001"}, headers=agent
        ).json()["run"]
        assert run["artifact_url"].endswith(run["artifact_sha256"])
        rates[run["variant_label"]] = expected_rate
        response = api.post(
            f"/api/v1/runs/{run['run_id']}/results",
            json=result_for(range(3), expected_rate),
            headers=agent,
        )
        assert response.json() == {
            "run_id": run["run_id"],
            "state": "succeeded",
            "prompts_stored": 3,
        }
    assert api.post(
        "/api/v1/agents/claim", json={"device_udid": "SIM-0001"}, headers=agent
    ).json() == {"run": None}

    sweep = api.get(f"/api/v1/sweeps/{ready_sweep['id']}", headers=bearer(user_token)).json()
    assert sweep["state"] == "completed"
    assert sweep["simulated"] is True
    first, second = sweep["results"]
    assert first["variant"] == "repeat_kv-ctx512-fp16" and first["tile_ops"] == 2
    assert first["decode_tok_s_mean"] == pytest.approx(51.0)  # 50, 51, 52
    assert second["speedup_vs_first"] == pytest.approx(101.0 / 51.0)
    assert second["predicted_tok_s"] == pytest.approx(55_900e6 / 600_000)
    assert all(row["simulated"] for row in sweep["results"])


def test_result_upload_is_idempotent_per_prompt(api, ready_sweep, agent_token) -> None:
    agent = bearer(agent_token)
    run = api.post("/api/v1/agents/claim", json={"device_udid": "SIM-0001"}, headers=agent).json()[
        "run"
    ]
    partial = api.post(
        f"/api/v1/runs/{run['run_id']}/results", json=result_for(range(2), 10.0), headers=agent
    )
    assert partial.json()["state"] == "running"
    for _ in range(2):
        done = api.post(
            f"/api/v1/runs/{run['run_id']}/results", json=result_for(range(3), 10.0), headers=agent
        )
        assert done.json() == {"run_id": run["run_id"], "state": "succeeded", "prompts_stored": 3}
    assert table_counts()["prompt_results"] == 3


def test_results_from_the_wrong_device_or_prompt_are_rejected(
    api, ready_sweep, agent_token
) -> None:
    agent = bearer(agent_token)
    run = api.post("/api/v1/agents/claim", json={"device_udid": "SIM-0001"}, headers=agent).json()[
        "run"
    ]
    wrong_device = api.post(
        f"/api/v1/runs/{run['run_id']}/results",
        json=result_for(range(3), 1.0, "OTHER"),
        headers=agent,
    )
    assert wrong_device.status_code == 422
    out_of_range = api.post(
        f"/api/v1/runs/{run['run_id']}/results", json=result_for(range(5), 1.0), headers=agent
    )
    assert out_of_range.status_code == 422
    assert "prompts.3: prompt_index is outside" in out_of_range.json()["detail"]
    assert table_counts()["prompt_results"] == 0


def test_failed_runs_are_retried_then_given_up(api, ready_sweep, agent_token, user_token) -> None:
    agent = bearer(agent_token)
    claimed = []
    while run := api.post(
        "/api/v1/agents/claim", json={"device_udid": "SIM-0001"}, headers=agent
    ).json()["run"]:
        claimed.append(run["variant_label"])
        api.post(
            f"/api/v1/runs/{run['run_id']}/fail", json={"reason": "device unplugged"}, headers=agent
        )
    # A run that failed on this device goes behind the others, so variants alternate.
    assert claimed == ["repeat_kv-ctx512-fp16", "folded-ctx512-fp16"] * 3
    sweep = api.get(f"/api/v1/sweeps/{ready_sweep['id']}", headers=bearer(user_token)).json()
    assert sweep["state"] == "failed"
    assert [run["failure_reason"] for run in sweep["runs"]] == [
        "device unplugged (gave up after 3 attempts)"
    ] * 2


def test_non_retryable_failure_fails_at_once(api, ready_sweep, agent_token) -> None:
    agent = bearer(agent_token)
    run = api.post("/api/v1/agents/claim", json={"device_udid": "SIM-0001"}, headers=agent).json()[
        "run"
    ]
    body = {"reason": "model does not fit", "retryable": False}
    assert api.post(f"/api/v1/runs/{run['run_id']}/fail", json=body, headers=agent).json() == {
        "state": "failed"
    }


def test_expired_lease_returns_the_run_to_the_queue(
    api, ready_sweep, agent_token, user_token
) -> None:
    from server.db import get_engine

    agent = bearer(agent_token)
    run = api.post("/api/v1/agents/claim", json={"device_udid": "SIM-0001"}, headers=agent).json()[
        "run"
    ]
    with get_engine().begin() as connection:
        connection.execute(
            text("UPDATE runs SET lease_expires_at = :past WHERE id = :id"),
            {"past": datetime.now(UTC) - timedelta(seconds=1), "id": run["run_id"]},
        )
    other = api.post(
        "/api/v1/agents/claim", json={"device_udid": "SIM-0001"}, headers=agent
    ).json()["run"]
    assert other["run_id"] != run["run_id"]
    sweep = api.get(f"/api/v1/sweeps/{ready_sweep['id']}", headers=bearer(user_token)).json()
    expired = next(item for item in sweep["runs"] if item["id"] == run["run_id"])
    assert (expired["state"], expired["failure_reason"]) == (
        "queued",
        "lease expired on device SIM-0001",
    )
    late = api.post(f"/api/v1/runs/{run['run_id']}/lease", headers=agent)
    assert late.status_code == 409
    # nobody claimed it again, so its finished results (kept in the agent's outbox through an
    # outage) are still the run's
    late_results = api.post(
        f"/api/v1/runs/{run['run_id']}/results", json=result_for(range(3), 1.0), headers=agent
    )
    assert late_results.status_code == 200 and late_results.json()["state"] == "succeeded"


def test_a_device_runs_one_run_at_a_time(api, ready_sweep, agent_token) -> None:
    agent = bearer(agent_token)
    api.post("/api/v1/agents/claim", json={"device_udid": "SIM-0001"}, headers=agent)
    second = api.post("/api/v1/agents/claim", json={"device_udid": "SIM-0001"}, headers=agent)
    assert second.status_code == 409


def test_heartbeat_marks_missing_devices_disconnected(
    api, ready_sweep, agent_token, user_token
) -> None:
    [listed] = api.get("/api/v1/devices", headers=bearer(user_token)).json()
    assert (listed["udid"], listed["connected"], listed["simulated"]) == ("SIM-0001", True, True)
    api.post("/api/v1/agents/heartbeat", json={"devices": []}, headers=bearer(agent_token))
    [listed] = api.get("/api/v1/devices", headers=bearer(user_token)).json()
    assert (listed["connected"], listed["status"]) == (False, "disconnected")


def test_artifact_with_wrong_digest_is_refused(api, worker_token) -> None:
    response = api.put(
        f"/api/v1/artifacts/{'0' * 64}", content=b"payload", headers=bearer(worker_token)
    )
    assert response.status_code == 422
    assert "not the address" in response.json()["detail"]
