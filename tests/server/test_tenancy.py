"""Projects own sweeps, builds (through their sweeps), schedules, alerts and calibrations: a
token of one project finds nothing of another's (404, never 403), in the API and in the pages;
a device pinned to a project claims only that project's runs."""

from __future__ import annotations

import hashlib

import pytest
from fastapi.testclient import TestClient

from tests.support.api import bearer, complete_build, project_token
from tests.support.pages import page_csrf, ui_sign_in

SWEEP = {
    "model": "tiny-gqa",
    "variants": [{"attention": "repeat_kv", "context": 128}, {"attention": "folded", "context": 128}],
    "devices": ["iphone-17-pro"],
    "prompts": 2,
    "decode_tokens": 4,
}  # fmt: skip
FIGURES = {"bytes_per_token": {"weights": 3 << 20, "kv_read": 1 << 20, "total": 4 << 20}}
PHONE = {"udid": "PHONE-A", "device_class": "iphone-17-pro", "product_type": "iPhone18,1",
         "driver": "pymobiledevice3", "simulated": False}  # fmt: skip
SHARED = {**PHONE, "udid": "PHONE-SHARED"}


def run_all(api, agent_token: str, device: dict) -> list[int]:
    """Claim and complete every run the device may take; the ids, in claim order."""
    agent, taken = bearer(agent_token), []
    while run := api.post("/api/v1/agents/claim", json={"device_udid": device["udid"]},
                          headers=agent).json()["run"]:  # fmt: skip
        result = {
            "device_udid": device["udid"], "device_class": device["device_class"],
            "product_type": device["product_type"], "driver": device["driver"],
            "simulated": device["simulated"], "load_time_cold_ms": 1.0, "load_time_warm_ms": 1.0,
            "peak_memory_bytes": 1, "timing_model": "test",
            "prompts": [{"prompt_index": index, "prompt_tokens": 5, "generated_tokens": 4,
                         "ttft_ms": 1.0, "prefill_tok_s": 10.0, "decode_tok_s": 30.0 + index,
                         "token_latencies_ms": [1.0] * 4} for index in range(2)],
        }  # fmt: skip
        stored = api.post(f"/api/v1/runs/{run['run_id']}/results", json=result, headers=agent)
        assert stored.json()["state"] == "succeeded", stored.text
        taken.append(run["run_id"])
    return taken


@pytest.fixture
def world(api, worker_token: str, agent_token: str) -> dict:
    """Project alpha: a measured sweep, a calibration, a schedule with a firing and an alert.
    Project beta: nothing yet."""
    from sqlalchemy import text

    from server.db import get_engine

    alpha, beta = project_token("alpha", "alice"), project_token("beta", "bob")
    api.post("/api/v1/agents/register", json={"name": "lab", "devices": [PHONE]},
             headers=bearer(agent_token))  # fmt: skip
    sweep = api.post("/api/v1/sweeps", json=SWEEP, headers=bearer(alpha)).json()
    for build in sweep["builds"]:
        complete_build(api, build, worker_token, FIGURES)
    assert len(run_all(api, agent_token, PHONE)) == 2
    sweep = api.get(f"/api/v1/sweeps/{sweep['id']}", headers=bearer(alpha)).json()
    calibrated = api.post("/api/v1/profiles/iphone-17-pro/calibrations", json={},
                          headers=bearer(alpha))  # fmt: skip
    assert calibrated.status_code == 201, calibrated.text
    schedule = {"name": "nightly", "spec": {**SWEEP, "variants": SWEEP["variants"][:1]},
                "cron": "0 2 * * *", "timezone": "UTC", "min_effect": 0.02}  # fmt: skip
    created = api.post("/api/v1/schedules", json=schedule, headers=bearer(alpha))
    assert created.status_code == 201, created.text
    firing = api.post(f"/api/v1/schedules/{created.json()['id']}/run-now", json={},
                      headers=bearer(alpha)).json()  # fmt: skip
    with get_engine().begin() as connection:  # detection's output, written as it would be
        connection.execute(
            text("INSERT INTO alerts (schedule_id, variant, device_class, direction, status, "
                 "last_good_firing_id, first_bad_firing_id, suspect) VALUES (:s, 'v', "
                 "'iphone-17-pro', 'regression', 'suspected', :f, :f, "
                 "'{\"relative_change\": -0.1}')"),
            {"s": created.json()["id"], "f": firing["id"]},
        )  # fmt: skip
    return {"alpha": alpha, "beta": beta, "sweep": sweep, "schedule": created.json(),
            "schedule_body": schedule}  # fmt: skip


def test_every_endpoint_family_answers_404_across_projects(api, world, agent_token) -> None:
    alpha, beta, sweep = bearer(world["alpha"]), bearer(world["beta"]), world["sweep"]
    s, run = sweep["id"], sweep["runs"][0]["id"]
    b1, b2 = (build["id"] for build in sweep["builds"])
    sha = sweep["builds"][0]["artifact_sha256"]
    schedule = world["schedule"]["id"]
    reason = {"reason": "bad artifact"}
    requests = [
        ("GET", f"/api/v1/sweeps/{s}", None),
        ("GET", f"/api/v1/sweeps/{s}/verdicts", None),
        ("POST", f"/api/v1/sweeps/{s}/cancel", None),
        ("POST", f"/api/v1/sweeps/{s}/runs/{run}/retry", None),
        ("GET", f"/api/v1/builds/{b1}", None),
        ("GET", f"/api/v1/builds/{b1}/diff/{b2}", None),
        ("POST", f"/api/v1/builds/{b1}/abandon", reason),
        ("POST", f"/api/v1/builds/{b1}/rebuild", reason),
        ("GET", f"/api/v1/artifacts/{sha}", None),
        ("GET", f"/api/v1/schedules/{schedule}", None),
        ("GET", f"/api/v1/schedules/{schedule}/firings", None),
        ("GET", f"/api/v1/schedules/{schedule}/series", None),
        ("POST", f"/api/v1/schedules/{schedule}/pause", None),
        ("POST", f"/api/v1/schedules/{schedule}/resume", None),
        ("POST", f"/api/v1/schedules/{schedule}/run-now", {}),
    ]
    for method, path, body in requests:
        answer = api.request(method, path, json=body, headers=beta)
        assert answer.status_code == 404, (path, answer.status_code, answer.text)
    # The owner reaches every one of them (reads answer 200; the writes were checked on 404
    # before any state check, so the owner's 409s show the rows exist).
    for method, path, _ in requests[:2] + requests[4:6] + requests[8:12]:
        assert api.request(method, path, headers=alpha).status_code == 200, path
    assert api.post(f"/api/v1/sweeps/{s}/cancel", headers=alpha).status_code == 409
    assert api.get(f"/api/v1/artifacts/{sha}", headers=bearer(agent_token)).status_code == 200

    # Lists hold nothing of the other project's.
    assert s in [row["id"] for row in api.get("/api/v1/sweeps", headers=alpha).json()]
    assert api.get("/api/v1/sweeps", headers=beta).json() == []
    assert api.get("/api/v1/schedules", headers=beta).json() == []
    assert api.get("/api/v1/alerts", headers=beta).json() == []
    assert api.get("/api/v1/alerts", params={"schedule_id": schedule}, headers=beta).json() == []
    assert len(api.get("/api/v1/alerts", headers=alpha).json()) == 1
    # Calibrations are the project's: beta's profile is the prior, and beta has nothing to fit.
    for token, calibrated in ((alpha, True), (beta, False)):
        profile = api.get("/api/v1/profiles/iphone-17-pro", headers=token).json()
        assert (profile["calibrated"], bool(profile["history"])) == (calibrated, calibrated)
    refused = api.post("/api/v1/profiles/iphone-17-pro/calibrations", json={}, headers=beta)
    assert refused.status_code == 409 and "no measured" in refused.json()["detail"]
    # A schedule's name is the project's own: beta may reuse alpha's.
    reused = api.post("/api/v1/schedules", json=world["schedule_body"], headers=beta)
    assert reused.status_code == 201, reused.text
    assert (
        api.post("/api/v1/schedules", json=world["schedule_body"], headers=beta).status_code == 409
    )
    # Nothing above changed alpha's rows.
    after = api.get(f"/api/v1/sweeps/{s}", headers=alpha).json()
    assert [b["state"] for b in after["builds"]] == ["succeeded", "succeeded"]
    assert api.get(f"/api/v1/schedules/{schedule}", headers=alpha).json()["enabled"]


def test_a_shared_build_becomes_visible_with_the_sweep_that_references_it(api, world) -> None:
    alpha_sweep, beta = world["sweep"], bearer(world["beta"])
    build = alpha_sweep["builds"][1]
    assert api.get(f"/api/v1/builds/{build['id']}", headers=beta).status_code == 404
    mine = api.post("/api/v1/sweeps", headers=beta,
                    json={**SWEEP, "variants": SWEEP["variants"][1:]}).json()  # fmt: skip
    assert [b["id"] for b in mine["builds"]] == [build["id"]]  # content-addressed: shared
    assert api.get(f"/api/v1/builds/{build['id']}", headers=beta).status_code == 200
    sha = build["artifact_sha256"]
    assert api.get(f"/api/v1/artifacts/{sha}", headers=beta).status_code == 200
    # Still nothing of alpha's sweep, nor of the build beta's sweeps do not use.
    assert api.get(f"/api/v1/sweeps/{alpha_sweep['id']}", headers=beta).status_code == 404
    other = alpha_sweep["builds"][0]["id"]
    assert api.get(f"/api/v1/builds/{other}", headers=beta).status_code == 404
    assert api.get(f"/api/v1/builds/{build['id']}/diff/{other}", headers=beta).status_code == 404
    verdicts = f"/api/v1/sweeps/{mine['id']}/verdicts?baseline_sweep={alpha_sweep['id']}"
    assert api.get(verdicts, headers=beta).status_code == 404


def test_pages_answer_404_across_projects(api, world) -> None:
    from server.app import app

    sweep = world["sweep"]
    s, run = sweep["id"], sweep["runs"][0]["id"]
    b1, b2 = (build["id"] for build in sweep["builds"])
    with TestClient(app) as browser:
        assert ui_sign_in(browser, world["beta"]).status_code == 303
        csrf = page_csrf(browser.get("/sweeps/new").text)
        for path in (f"/sweeps/{s}", f"/sweeps/{s}/live", f"/builds/{b1}",
                     f"/builds/{b1}/download", f"/builds/{b1}/diff/{b2}"):  # fmt: skip
            page = browser.get(path)
            assert page.status_code == 404, (path, page.status_code)
            assert "Not found" in page.text and "repeat_kv" not in page.text
        for path in (f"/sweeps/{s}/cancel", f"/sweeps/{s}/runs/{run}/retry"):
            assert browser.post(path, data={"csrf_token": csrf}).status_code == 404, path
        assert f'href="/sweeps/{s}"' not in browser.get("/").text
        fleet = browser.get("/devices").text
        assert f'href="/sweeps/{s}"' not in fleet and "PHONE-A" in fleet  # shared device
        profiles = browser.get("/profiles").text
    with TestClient(app) as owner:
        ui_sign_in(owner, world["alpha"])
        assert owner.get(f"/sweeps/{s}").status_code == 200
        assert owner.get(f"/builds/{b1}").status_code == 200
        assert profiles != owner.get("/profiles").text  # alpha's calibration, not beta's prior


def test_a_pinned_device_never_takes_another_projects_run(api, agent_token, worker_token) -> None:
    from server.manage import pin_device_command

    alpha, beta = project_token("alpha", "alice"), project_token("beta", "bob")
    api.post("/api/v1/agents/register", json={"name": "lab", "devices": [PHONE, SHARED]},
             headers=bearer(agent_token))  # fmt: skip
    pin_device_command(PHONE["udid"], "alpha")
    # beta's sweep first: an unpinned device would take its runs first (older sweep).
    sweeps = {}
    for name, token in (("beta", beta), ("alpha", alpha)):
        sweeps[name] = api.post("/api/v1/sweeps", json=SWEEP, headers=bearer(token)).json()
    for build in sweeps["beta"]["builds"]:  # the same builds serve both sweeps
        complete_build(api, build, worker_token, FIGURES)
    pinned = run_all(api, agent_token, PHONE)
    assert sorted(pinned) == sorted(run["id"] for run in sweeps["alpha"]["runs"])
    assert sorted(run_all(api, agent_token, SHARED)) == sorted(
        run["id"] for run in sweeps["beta"]["runs"]
    )
    # Only alpha sees its pinned device; beta sees the shared one.
    listed = {
        name: {d["udid"] for d in api.get("/api/v1/devices", headers=bearer(token)).json()}
        for name, token in (("alpha", alpha), ("beta", beta))
    }
    assert listed == {"alpha": {"PHONE-A", "PHONE-SHARED"}, "beta": {"PHONE-SHARED"}}


def test_tokens_land_in_the_default_project_and_stay_in_one(api, user_token) -> None:
    from sqlalchemy import select

    from server.db import get_sessionmaker
    from server.manage import create_token_command, main
    from server.models import ApiToken, Project

    with pytest.raises(ValueError, match="another project"):
        create_token_command("user", "ci", user_token, (), "elsewhere")

    with get_sessionmaker()() as session:
        token = session.scalar(select(ApiToken).where(ApiToken.name == "ci"))
        assert token is not None and token.project_id is not None
        assert session.get_one(Project, token.project_id).name == "default"
    assert main(["create-token", "--kind", "agent", "--name", "a", "--project", "x"]) == 2
    assert main(["pin-device", "--udid", "nowhere", "--project", "default"]) == 2
    created = api.post("/api/v1/sweeps", json=SWEEP, headers=bearer(user_token))
    assert created.status_code == 201
    digest = hashlib.sha256(b"never uploaded").hexdigest()
    assert api.get(f"/api/v1/artifacts/{digest}", headers=bearer(user_token)).status_code == 404
    # A user token without a project (only an edit of the database makes one) sees nothing.
    from sqlalchemy import text

    from server.db import get_engine

    with get_engine().begin() as connection:
        connection.execute(text("UPDATE api_tokens SET project_id = NULL WHERE name = 'ci'"))
    sweep_id = created.json()["id"]
    assert api.get(f"/api/v1/sweeps/{sweep_id}", headers=bearer(user_token)).status_code == 404
    assert api.get("/api/v1/sweeps", headers=bearer(user_token)).json() == []
    refused = api.post("/api/v1/sweeps", json=SWEEP, headers=bearer(user_token))
    assert refused.status_code == 403 and "no project" in refused.json()["detail"]


def test_a_claim_times_a_run_with_its_own_project_s_calibration(db) -> None:
    """An agent's session serves every project: the profile it hands a run is the run's
    project's calibrated one, never the newest calibration of any project."""
    from server import tenancy
    from server.db import get_sessionmaker
    from server.models import ProfileCalibration
    from server.profiles.service import current_profiles

    def calibration(project_id: int, bandwidth: float) -> ProfileCalibration:
        return ProfileCalibration(
            device_class="iphone-17-pro", effective_bandwidth_mb_s=bandwidth,
            dispatch_overhead_us=0.0, calibrated_parameters=["effective_bandwidth_mb_s"],
            runs=4, builds=2, includes_simulated=False, rms_relative_error=0.01, points=[],
            requested_by="test", project_id=project_id,
        )  # fmt: skip

    with get_sessionmaker()() as session, session.begin():
        own = tenancy.project_named(session, "own", create=True).id
        other = tenancy.project_named(session, "other", create=True).id
        session.add(calibration(own, 41_000.0))
        session.flush()
        session.add(calibration(other, 12_345.0))  # newer, of another project
        session.flush()
        unbound = current_profiles(session, own)["iphone-17-pro"]
        assert unbound.effective_bandwidth_mb_s == pytest.approx(41_000.0)
        assert current_profiles(session, other)["iphone-17-pro"].effective_bandwidth_mb_s == (
            pytest.approx(12_345.0)
        )
