"""Doctor jobs over the API: bad requests refused naming the field with nothing written, the
worker's life cycle (lease, progress, completion registering the repaired package and submitting
the A/B sweep, a second completion refused), the download (409 before done), tenancy (another
project's job does not exist), and a job whose worker went silent queued again."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import pytest

from decodebench.contracts.doctor import DoctorReport
from tests.support.api import bearer, project_token
from tests.support.doctor_jobs import massive_channel_package, zipped
from tests.support.services import query
from tests.support.uploads import register

pytest.importorskip("coremltools")
DEVICES = ["iphone-16-pro", "iphone-17-pro"]


@pytest.fixture(scope="module")
def doctored(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, DoctorReport, Path]:
    """The package zipped, its doctor report on 2 chat prompts x 4 steps, the repaired zip."""
    from decodebench.artifacts import pack_directory
    from decodebench.building.realmodels import fetch_model
    from decodebench.doctor.doctor import doctor
    from decodebench.prompts import chat_prompts, chat_token_ids

    root = tmp_path_factory.mktemp("doctored")
    package = massive_channel_package(root)
    prompts = chat_token_ids(
        fetch_model("smollm2-135m"), [prompt.text for prompt in chat_prompts(2)]
    )
    (root / "out").mkdir()
    report = doctor(package, root / "out" / "fixed.mlpackage", prompts, 4)
    return zipped(package, root), report, pack_directory(root / "out", root / "fixed.zip")


def submit(api, token: str, **fields):
    body = {"package": "massive", "devices": DEVICES, "prompts": 2, "steps": 4, **fields}
    return api.post("/api/v1/doctor", json=body, headers=bearer(token))


def upload_package(api, token: str, doctored, name: str = "massive") -> None:
    archive, _, _ = doctored
    created = register(api, token, name, {archive.name: archive.read_bytes()})
    assert created.status_code == 201, created.text


def test_bad_requests_name_the_field_and_write_nothing(
    api, user_token, doctored, tiny_llama_folder
) -> None:
    upload_package(api, user_token, doctored)
    files = {path.name: path.read_bytes() for path in tiny_llama_folder.iterdir()}
    assert register(api, user_token, "ckpt", files).status_code == 201
    cases: list[tuple[dict[str, object], str]] = [
        ({"package": "nothing"}, "package: no uploaded model 'nothing'"),
        ({"package": "ckpt"}, "package: 'ckpt' is a hf checkpoint, not a .mlpackage"),
        ({"devices": ["iphone-3g"]}, "devices"),
        ({"devices": []}, "devices"),
        ({"prompts": 31}, "prompts"),
        ({"prompts": "2"}, "prompts"),
        ({"steps": 0}, "steps"),
        ({"tokenizer": "gpt2"}, "tokenizer"),
        ({"tokenizer": "upload:nothing"}, "tokenizer: no uploaded model 'nothing'"),
        ({"tokenizer": "upload:massive"}, "tokenizer: 'massive' is a package"),
        ({"tokenizer": "upload:ckpt"}, "tokenizer: 'ckpt' holds no tokenizer files"),
        ({"colour": "blue"}, "colour"),
    ]
    for fields, named in cases:
        response = submit(api, user_token, **fields)
        assert response.status_code == 422, (fields, response.text)
        assert named in response.text, (fields, response.text)
    unknown_device = submit(api, user_token, devices=["iphone-3g"]).json()
    assert "iphone-3g" in str(unknown_device)
    assert query("SELECT id FROM doctor_jobs") == []
    assert query("SELECT id FROM transitions WHERE entity = 'doctor'") == []


def test_a_job_through_the_worker_api_to_its_repaired_package_and_ab_sweep(
    api, user_token, worker_token, doctored
) -> None:
    archive, report, repaired_zip = doctored
    upload_package(api, user_token, doctored)
    submitted = submit(api, user_token)
    assert submitted.status_code == 202, submitted.text
    job = submitted.json()
    assert job["state"] == "queued" and job["report"] is None and job["ab"] == []
    path = f"/api/v1/doctor/{job['id']}"
    early = api.get(f"{path}/package", headers=bearer(user_token))
    assert early.status_code == 409 and "not ready" in early.text

    worker = bearer(worker_token)
    assignment = api.get(f"{path}/assignment", headers=worker).json()
    assert (assignment["package"], assignment["prompts"], assignment["steps"]) == ("massive", 2, 4)
    started = api.post(f"{path}/start", json={"worker": "w1"}, headers=worker).json()
    assert started["proceed"] and started["state"] == "running"
    lease = started["lease"]
    again = api.post(f"{path}/start", json={"worker": "w2"}, headers=worker).json()
    assert again == {"proceed": False, "state": "running", "lease": None, "lease_seconds": None}
    progress = {"lease": lease, "stage": "measuring fp16 headroom", "fraction": 0.4}
    assert api.post(f"{path}/progress", json=progress, headers=worker).status_code == 204
    running = api.get(path, headers=bearer(user_token)).json()
    assert (running["stage"], running["progress"]) == ("measuring fp16 headroom", 0.4)

    data = repaired_zip.read_bytes()
    import hashlib

    sha256 = hashlib.sha256(data).hexdigest()
    outcome = {
        "lease": lease,
        "artifact_sha256": sha256,
        "context": 128,
        "report": report.model_dump(mode="json"),
    }
    missing = api.post(f"{path}/complete", json=outcome, headers=worker)
    assert missing.status_code == 422 and "has not been uploaded" in missing.text
    assert api.put(f"/api/v1/artifacts/{sha256}", content=data, headers=worker).status_code == 201
    bad_lease = api.post(f"{path}/complete", json={**outcome, "lease": "0" * 32}, headers=worker)
    assert bad_lease.status_code == 409
    done = api.post(f"{path}/complete", json=outcome, headers=worker)
    assert done.status_code == 200, done.text
    assert done.json() == {"state": "done"}
    duplicate = api.post(f"{path}/complete", json=outcome, headers=worker)
    assert duplicate.status_code == 409 and "not held under this lease" in duplicate.text
    assert len(query("SELECT id FROM sweeps")) == 1  # the duplicate submitted nothing

    view = api.get(path, headers=bearer(user_token)).json()
    assert view["state"] == "done" and view["repaired_model"] == "massive.repaired"
    assert DoctorReport.model_validate(view["report"]) == report
    assert view["report"]["headroom"]["first_non_finite"]["label"].startswith("layer 1")
    assert {row["variant"] for row in view["ab"]} == {"original", "repaired"}
    assert {row["device_class"] for row in view["ab"]} == set(DEVICES)
    sweep = api.get(f"/api/v1/sweeps/{view['sweep_id']}", headers=bearer(user_token)).json()
    assert [v["package"] for v in sweep["spec"]["variants"]] == ["massive", "massive.repaired"]
    assert [v["allow_non_finite"] for v in sweep["spec"]["variants"]] == [True, False]
    assert sweep["model"] == "smollm2-135m" and sweep["baseline"] == "original"
    model = api.get("/api/v1/models/massive.repaired", headers=bearer(user_token)).json()
    assert (
        model["kind"] == "package"
        and model["format"] == "coreml"
        and model["files"][0]["sha256"] == sha256
    )

    download = api.get(f"{path}/package", headers=bearer(user_token))
    assert download.status_code == 200 and download.content == data
    assert "massive.repaired.mlpackage.zip" in download.headers["content-disposition"]
    names = zipfile.ZipFile(io.BytesIO(download.content)).namelist()
    assert "fixed.mlpackage/Manifest.json" in names
    listed = api.get("/api/v1/doctor", headers=bearer(user_token)).json()
    assert [(item["id"], item["state"]) for item in listed] == [(job["id"], "done")]


def test_another_projects_job_does_not_exist(api, user_token, worker_token, doctored) -> None:
    upload_package(api, user_token, doctored)
    job = submit(api, user_token).json()
    other = project_token("elsewhere", "them")
    for path in (f"/api/v1/doctor/{job['id']}", f"/api/v1/doctor/{job['id']}/package"):
        response = api.get(path, headers=bearer(other))
        assert response.status_code == 404, (path, response.text)
    assert api.get("/api/v1/doctor", headers=bearer(other)).json() == []
    refused = submit(api, other)
    assert refused.status_code == 422 and "no uploaded model 'massive'" in refused.text
    # Tokens of other kinds do not read jobs; a user token does not drive them.
    assert (
        api.get(f"/api/v1/doctor/{job['id']}/assignment", headers=bearer(user_token)).status_code
        == 403
    )


def test_a_silent_worker_s_job_is_queued_again_then_failed_after_its_last_attempt(
    api, user_token, worker_token, doctored
) -> None:
    from sqlalchemy import text

    from server.db import get_engine

    upload_package(api, user_token, doctored)
    job = submit(api, user_token).json()
    path, worker = f"/api/v1/doctor/{job['id']}", bearer(worker_token)

    def expire() -> None:
        with get_engine().begin() as connection:
            connection.execute(
                text("UPDATE doctor_jobs SET lease_expires_at = now() - interval '1 second'")
            )

    first = api.post(f"{path}/start", json={"worker": "w1"}, headers=worker).json()
    expire()
    assert api.post("/api/v1/doctor/reconcile", headers=worker).json() == {
        "reenqueued": [job["id"]]
    }
    assert api.get(path, headers=bearer(user_token)).json()["state"] == "queued"
    late = {"lease": first["lease"], "stage": "still here", "fraction": 0.5}
    assert api.post(f"{path}/progress", json=late, headers=worker).status_code == 409
    api.post(f"{path}/start", json={"worker": "w2"}, headers=worker)
    expire()
    assert api.post("/api/v1/doctor/reconcile", headers=worker).json() == {"reenqueued": []}
    failed = api.get(path, headers=bearer(user_token)).json()
    assert failed["state"] == "failed" and failed["attempts"] == 2
    assert "w2 stopped renewing its lease; gave up after 2 attempts" in failed["error"]


def test_a_worker_s_failure_is_the_job_s_error(api, user_token, worker_token, doctored) -> None:
    upload_package(api, user_token, doctored)
    job = submit(api, user_token).json()
    path, worker = f"/api/v1/doctor/{job['id']}", bearer(worker_token)
    lease = api.post(f"{path}/start", json={"worker": "w1"}, headers=worker).json()["lease"]
    reason = "tokenizer: ids up to 49151, the package's vocabulary has 128 tokens"
    failed = api.post(f"{path}/fail", json={"lease": lease, "reason": reason}, headers=worker)
    assert failed.json() == {"state": "failed"}
    view = api.get(path, headers=bearer(user_token)).json()
    assert view["error"] == reason
    assert api.get(f"{path}/package", headers=bearer(user_token)).status_code == 409
