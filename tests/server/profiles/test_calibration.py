"""Calibrating device profiles from runs stored in the database, over HTTP and in the pages.

Runs are driven as a worker and an agent would (see tests/server/runs/test_lifecycle.py), with
decode speeds generated from a known "true" device, so the fit has a right answer.
"""

from __future__ import annotations

import re

import pytest

from tests.support.api import bearer, complete_build, make_token
from tests.support.pages import page_csrf, ui_sign_in

TRUE_BANDWIDTH_MB_S = 61_000.0
TRUE_OVERHEAD_US = 4.0
# Per variant: (bytes moved per token, dispatched ops), as the analysis reports them.
VARIANTS = {
    "repeat_kv-ctx512-fp16": (4_824_000_000, 2_299),
    "folded-ctx512-fp16": (2_810_000_000, 2_179),
    "folded-ctx1024-fp16": (900_000_000, 2_400),
}
SWEEP = {
    "model": "tiny-gqa",
    "variants": [
        {"attention": "repeat_kv"},
        {"attention": "folded"},
        {"attention": "folded", "context": 1024},
    ],
    "devices": ["iphone-17-pro"],
    "prompts": 2,
    "decode_tokens": 4,
}
PHONE = {"udid": "PHONE-1", "device_class": "iphone-17-pro", "product_type": "iPhone18,1",
         "driver": "pymobiledevice3", "simulated": False}  # fmt: skip
SIMULATED = {**PHONE, "udid": "SIM-1", "driver": "simulated", "simulated": True}


def true_tok_s(label: str) -> float:
    moved, ops = VARIANTS[label]
    return 1 / (moved / (TRUE_BANDWIDTH_MB_S * 1e6) + ops * TRUE_OVERHEAD_US * 1e-6)


def finish_builds(api, sweep: dict, worker_token: str) -> None:
    for build in sweep["builds"]:
        moved, ops = VARIANTS[build["label"]]
        analysis = {"ops_total": ops + 100, "non_const_ops": ops, "dispatch_ops": ops,
                    "op_counts": {}, "tile_ops": 0, "tile_output_bytes": 0, "state_write_ops": 4,
                    "weight_bytes": 1000, "bytes_per_token": {"total": moved}}  # fmt: skip
        complete_build(api, build, worker_token, analysis)


def run_everything(
    api, agent_token: str, device: dict, speed_factor: float = 1.0, prompts: int = 2
) -> int:
    """Claim and complete every queued run on ``device``; returns how many ran."""
    agent = bearer(agent_token)
    done = 0
    while run := api.post("/api/v1/agents/claim", json={"device_udid": device["udid"]},
                          headers=agent).json()["run"]:  # fmt: skip
        rate = true_tok_s(run["variant_label"]) * speed_factor
        result = {
            "device_udid": device["udid"], "device_class": device["device_class"],
            "product_type": device["product_type"], "driver": device["driver"],
            "simulated": device["simulated"], "load_time_cold_ms": 1.0, "load_time_warm_ms": 1.0,
            "peak_memory_bytes": 1, "timing_model": "test",
            "prompts": [{"prompt_index": index, "prompt_tokens": 5, "generated_tokens": 4,
                         "ttft_ms": 1.0, "prefill_tok_s": 10.0, "decode_tok_s": rate,
                         "token_latencies_ms": [1.0] * 4} for index in range(prompts)],
        }  # fmt: skip
        response = api.post(f"/api/v1/runs/{run['run_id']}/results", json=result, headers=agent)
        assert response.json()["state"] == "succeeded", response.text
        done += 1
    return done


@pytest.fixture
def user_token(db: None) -> str:
    """Calibrating changes every user's predictions: these tests act as an operator."""
    return make_token("user", "ci", ("read", "submit", "admin"))


@pytest.fixture
def measured(api, user_token: str, worker_token: str, agent_token: str) -> dict:
    """A sweep of three builds run on a real iPhone 17 Pro, then the same on a simulated one."""
    registration = {"name": "lab-1", "devices": [PHONE, SIMULATED]}
    api.post("/api/v1/agents/register", json=registration, headers=bearer(agent_token))
    sweep = api.post("/api/v1/sweeps", json=SWEEP, headers=bearer(user_token)).json()
    finish_builds(api, sweep, worker_token)
    assert run_everything(api, agent_token, PHONE) == 3
    # The same builds again (content-addressed), run on the simulated phone at 3x the speed.
    again = api.post("/api/v1/sweeps", json={**SWEEP, "prompts": 3}, headers=bearer(user_token))
    assert {build["id"] for build in again.json()["builds"]} == {b["id"] for b in sweep["builds"]}
    assert run_everything(api, agent_token, SIMULATED, speed_factor=3.0, prompts=3) == 3
    return sweep


def calibrate(api, user_token: str, **body) -> dict:
    response = api.post(
        "/api/v1/profiles/iphone-17-pro/calibrations", json=body, headers=bearer(user_token)
    )
    assert response.status_code == 201, response.text
    return response.json()


def test_calibration_fits_the_measured_runs_only(api, measured, user_token) -> None:
    fitted = calibrate(api, user_token)
    assert fitted["effective_bandwidth_mb_s"] == pytest.approx(TRUE_BANDWIDTH_MB_S, rel=1e-6)
    assert fitted["dispatch_overhead_us"] == pytest.approx(TRUE_OVERHEAD_US, rel=1e-4)
    assert fitted["calibrated_parameters"] == ["effective_bandwidth_mb_s", "dispatch_overhead_us"]
    assert (fitted["runs"], fitted["builds"], fitted["includes_simulated"]) == (3, 3, False)
    assert fitted["requested_by"] == "ci"
    assert len(fitted["points"]) == 3 and not any(p["simulated"] for p in fitted["points"])

    profiles = api.get("/api/v1/profiles", headers=bearer(user_token)).json()
    by_class = {profile["device_class"]: profile for profile in profiles}
    assert list(by_class) == ["iphone-15-pro", "iphone-16-pro", "iphone-17-pro", "host-cpu"]
    seventeen = by_class["iphone-17-pro"]
    assert seventeen["calibrated"] and seventeen["calibration_runs"] == 3
    assert [(p["name"], p["calibrated"]) for p in seventeen["parameters"]] == [
        ("effective_bandwidth_mb_s", True),
        ("dispatch_overhead_us", True),
    ]
    assert seventeen["parameters"][0]["prior"] == 55_900.0
    assert not by_class["iphone-16-pro"]["calibrated"]


def test_predictions_use_the_calibrated_profile(api, measured, user_token) -> None:
    before = api.get(f"/api/v1/sweeps/{measured['id']}", headers=bearer(user_token)).json()
    assert not any(row["prediction_calibrated"] for row in before["results"])
    calibrate(api, user_token)
    after = api.get(f"/api/v1/sweeps/{measured['id']}", headers=bearer(user_token)).json()
    for row in after["results"]:
        assert row["prediction_calibrated"]
        assert row["predicted_tok_s"] == pytest.approx(true_tok_s(row["variant"]), rel=1e-4)
        assert "fitted from 3 measured runs of 3 builds" in row["prediction_source"]
    build = api.get(f"/api/v1/builds/{measured['builds'][0]['id']}", headers=bearer(user_token))
    predicted = build.json()["analysis"]["predicted_tok_s"]
    assert predicted["iphone-17-pro"] == pytest.approx(true_tok_s("repeat_kv-ctx512-fp16"), 1e-4)
    assert predicted["iphone-16-pro"] == pytest.approx(44_161e6 / 4_824_000_000, rel=1e-3)


def test_simulated_runs_only_when_asked_and_never_over_a_measured_fit(
    api, measured, user_token
) -> None:
    with_simulated = calibrate(api, user_token, include_simulated=True)
    assert (with_simulated["runs"], with_simulated["includes_simulated"]) == (6, True)
    profile = api.get("/api/v1/profiles/iphone-17-pro", headers=bearer(user_token)).json()
    assert profile["calibration"]["id"] == with_simulated["id"]  # the only fit so far
    assert "SIMULATED runs" in profile["source"]

    measured_fit = calibrate(api, user_token)
    newer_simulated = calibrate(api, user_token, include_simulated=True)
    profile = api.get("/api/v1/profiles/iphone-17-pro", headers=bearer(user_token)).json()
    assert profile["calibration"]["id"] == measured_fit["id"]  # measured wins, even if older
    assert [row["id"] for row in profile["history"]] == [
        newer_simulated["id"], measured_fit["id"], with_simulated["id"]
    ]  # fmt: skip


def test_calibrating_without_runs_is_a_conflict(api, user_token) -> None:
    response = api.post(
        "/api/v1/profiles/iphone-15-pro/calibrations", json={}, headers=bearer(user_token)
    )
    assert response.status_code == 409
    assert response.json()["detail"] == (
        "iphone-15-pro: no measured (non-simulated) runs with an analysed build to calibrate from"
    )
    unknown = api.post("/api/v1/profiles/pixel-9/calibrations", json={}, headers=bearer(user_token))
    assert unknown.status_code == 404 and "unknown device class 'pixel-9'" in unknown.text
    assert api.get("/api/v1/profiles", headers=bearer("nope-not-a-token")).status_code == 401


def sign_in(api, user_token: str) -> None:
    assert ui_sign_in(api, user_token).status_code == 303


def test_profiles_page_shows_what_is_calibrated_and_from_how_many_runs(
    api, measured, user_token
) -> None:
    sign_in(api, user_token)
    page = api.get("/profiles").text
    assert page.count("not calibrated") == 4  # three iPhone classes and the host CPU
    assert 'href="/profiles"' in page  # in the navigation

    csrf = page_csrf(page)
    response = api.post(
        "/profiles/iphone-17-pro/calibrate", data={"csrf_token": csrf}, follow_redirects=False
    )
    assert (response.status_code, response.headers["location"]) == (303, "/profiles")
    page = api.get("/profiles").text
    row = re.search(r'data-device-class="iphone-17-pro".*?</tr>', page, re.S).group(0)
    assert "calibrated</span>" in row and "3 runs of 3 builds" in row
    assert "61,000.00 MB/s" in row and "55,900.00 MB/s" in row  # fitted value and prior
    assert page.count("not calibrated") == 3

    api.post(
        "/profiles/iphone-17-pro/calibrate", data={"include_simulated": "1", "csrf_token": csrf}
    )
    assert "6 runs of 3 builds" not in api.get("/profiles").text  # the measured fit stays current

    failed = api.post("/profiles/iphone-16-pro/calibrate", data={"csrf_token": csrf})
    assert failed.url.path == "/profiles"  # post/redirect/get, with the reason shown
    assert "iphone-16-pro: no measured (non-simulated) runs" in failed.text

    sweep_page = api.get(f"/sweeps/{measured['id']}").text
    assert "(calibrated)" in sweep_page


def test_simulated_devices_time_with_the_calibrated_profile(
    api, measured, user_token, agent_token, tmp_path
) -> None:
    """After a calibration the run assignment carries the calibrated profile and the build's
    dispatched ops, and the simulated driver times with them: without noise, its decode speed
    is the sweep's prediction, so the measured and predicted columns agree."""
    from agent.drivers.simulated import SimulatedDevice, simulate_run
    from agent.runner import build_job
    from decodebench.contracts.protocol import RunAssignment
    from decodebench.timing import TimingParameters

    fitted = calibrate(api, user_token)
    again = api.post("/api/v1/sweeps", json={**SWEEP, "variants": SWEEP["variants"][:1]},
                     headers=bearer(user_token)).json()  # fmt: skip
    claim = api.post("/api/v1/agents/claim", json={"device_udid": SIMULATED["udid"]},
                     headers=bearer(agent_token)).json()["run"]  # fmt: skip
    assignment = RunAssignment.model_validate(claim)
    profile = assignment.device_profile
    assert profile is not None and profile.calibrated
    assert profile.effective_bandwidth_mb_s == fitted["effective_bandwidth_mb_s"]
    assert profile.dispatch_overhead_us == fitted["dispatch_overhead_us"]
    assert assignment.dispatch_ops == VARIANTS["repeat_kv-ctx512-fp16"][1]

    result = simulate_run(
        build_job(assignment), SimulatedDevice(SIMULATED["udid"], "iphone-17-pro"), 1000,
        TimingParameters(noise_scale=0), profile, assignment.dispatch_ops,
    )  # fmt: skip
    assert f"calibration {fitted['id']}" in result.timing_model
    upload = api.post(f"/api/v1/runs/{assignment.run_id}/results",
                      json=result.model_dump(mode="json"), headers=bearer(agent_token))  # fmt: skip
    assert upload.json()["state"] == "succeeded", upload.text
    row = api.get(f"/api/v1/sweeps/{again['id']}", headers=bearer(user_token)).json()["results"][0]
    assert row["prediction_calibrated"]
    assert row["decode_tok_s_mean"] == pytest.approx(row["predicted_tok_s"], rel=1e-9)
    assert row["predicted_tok_s"] == pytest.approx(true_tok_s("repeat_kv-ctx512-fp16"), rel=1e-4)
