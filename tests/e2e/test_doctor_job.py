"""A doctor job end to end with real processes: a package converted as Apple's recipe converts
it (its norms overflow in fp16) is uploaded with the CLI, a doctor job is started over the API,
its first worker is killed with SIGKILL mid-job and beat's reconciler has a second worker run it
once; the job diagnoses (first overflow named by layer and role), repairs and proves, registers
the repaired package and runs the A/B sweep of the two on two simulated iPhone classes; the
report page renders in Chromium; the repaired package downloads as a zip that loads, carries the
repair's metadata and decodes without a non-finite value."""

from __future__ import annotations

import os
import signal
import time
import zipfile
from pathlib import Path

import httpx
import pytest

from decodebench.cli import main
from decodebench.client import ApiError, DecodebenchClient
from decodebench.commands.cure import summary
from decodebench.commands.submit import wait_for_sweep
from scripts.stack import Stack
from tests.support.api import bearer
from tests.support.browser import check_pages, sign_in
from tests.support.doctor_jobs import massive_channel_checkpoint, massive_channel_package
from tests.support.services import query

pytestmark = pytest.mark.slow
DEVICES = ["iphone-16-pro", "iphone-17-pro"]


def wait_for(condition, timeout_s: float, stack: Stack, what: str, every: float = 0.05):
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        stack.check_alive()
        time.sleep(every)


def test_a_doctor_job_cures_a_package_through_a_killed_worker(
    stack: Stack, tmp_path: Path, capsys, page
) -> None:
    stack.stop()  # the fixture's server, again with a short lease: a killed worker is noticed soon
    stack.processes.clear()
    stack.start_server(DECODEBENCH_DOCTOR_LEASE_SECONDS="3")
    package = massive_channel_package(tmp_path / "package")
    capsys.readouterr()
    user = ["--server", stack.server_url, "--token", stack.tokens["user"]]
    assert main(["model", "upload", str(package), "--name", "massive", *user]) == 0
    assert "massive: coreml package" in capsys.readouterr().out
    # Its checkpoint, with SmolLM2's tokenizer: named as the job's tokenizer, its transformers
    # fp32 decodes the prompts too.
    from decodebench.building.realmodels import fetch_model

    checkpoint = massive_channel_checkpoint(tmp_path / "checkpoint", fetch_model("smollm2-135m"))
    assert main(["model", "upload", str(checkpoint), "--name", "massive-src", *user]) == 0
    assert "massive-src: hf" in capsys.readouterr().out

    with DecodebenchClient(stack.server_url, stack.tokens["user"]) as client:
        request = {"package": "massive", "devices": DEVICES, "prompts": 2, "steps": 4}
        for bad, field in (({"devices": ["iphone-3g"]}, "iphone-3g"), ({"steps": 0}, "steps")):
            with pytest.raises(ApiError) as refused:
                client.submit_doctor({**request, **bad})
            assert refused.value.status_code == 422 and field in str(refused.value.detail)
        assert query("SELECT id FROM doctor_jobs") == []

        capsys.readouterr()
        assert main(["cure", "nothing", "--device", DEVICES[0], *user]) == 2
        assert "package: no uploaded model 'nothing'" in capsys.readouterr().err
        assert query("SELECT id FROM doctor_jobs") == []

        first = stack.start_worker("worker-1")
        devices = [arg for device in DEVICES for arg in ("--device", device)]
        tokenizer = ["--tokenizer", "upload:massive-src"]
        assert (
            main(["cure", "massive", *devices, *tokenizer, "--prompts", "2", "--steps", "4", *user])
            == 0
        )
        job_id = int(capsys.readouterr().out.split()[2].rstrip(":"))
        job = client.get_doctor(job_id)
        assert job.state in ("queued", "running") and job.devices == DEVICES
        with pytest.raises(ApiError) as early:
            client.download_repaired(job.id, tmp_path / "early.zip")
        assert early.value.status_code == 409

        # SIGKILL the first worker once it holds the job, before it reports.
        wait_for(lambda: client.get_doctor(job.id).state == "running", 120, stack, "a start")
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=10)
        del stack.processes["worker-1"]
        assert client.get_doctor(job.id).state == "running"
        stack.start_worker("worker-2")
        stack.start_beat(reconcile_interval_s=1.0)
        stack.start_agent(DEVICES)
        done = wait_for(
            lambda: (view := client.get_doctor(job.id)).state in ("done", "failed") and view,
            240,
            stack,
            "the doctor job",
            every=0.5,
        )
        assert done.state == "done", done.error
        assert done.attempts == 2
        reasons = [row[0] for row in query(
            "SELECT reason FROM transitions WHERE entity = 'doctor' ORDER BY id"
        )]  # fmt: skip
        assert any("worker-1 stopped renewing its lease; queued again" in r for r in reasons)
        assert sum(r.startswith("repaired") for r in reasons) == 1  # finished once

        report = done.report
        assert report is not None
        first_overflow = report.headroom.first_non_finite
        assert first_overflow is not None
        assert first_overflow.label == "layer 1 · input norm · square"
        overflowing = {hazard.layer for hazard in report.headroom.overflows}
        assert {1, 2} <= overflowing  # the channel is massive from layer 1's input norm on
        assert report.repair.applied == ["norms"]
        assert report.repair.result.identical == 2 and report.repair.original.non_finite == 2
        assert done.repaired_model == "massive.repaired"
        assert report.checkpoint is not None  # the uploaded checkpoint's transformers fp32
        assert report.checkpoint.reference.identical == 2
        assert report.checkpoint.repaired.identical == 2
        printed = summary(done)
        assert "first non-finite in fp16: layer 1 · input norm · square" in printed
        assert "repairs applied: norms" in printed and "2/2 prompts identical" in printed

        # A second completion of a done job is refused and changes nothing.
        late = httpx.post(
            f"{stack.server_url}/api/v1/doctor/{job.id}/complete",
            json={"lease": "0" * 32, "artifact_sha256": done.repaired_sha256, "context": 128,
                  "report": report.model_dump(mode="json")},
            headers=bearer(stack.tokens["worker"]),
            timeout=30,
        )  # fmt: skip
        assert late.status_code == 409
        assert len(query("SELECT id FROM sweeps")) == 1

        assert done.sweep_id is not None
        sweep = wait_for_sweep(client, done.sweep_id, timeout_s=300)
        assert sweep.state == "completed", sweep
        cured = client.get_doctor(job.id)
        rows = {(row.device_class, row.variant): row for row in cured.ab}
        assert set(rows) == {
            (device, variant) for device in DEVICES for variant in ("original", "repaired")
        }
        for row in rows.values():
            assert row.prompts_measured == 2 and row.simulated
        for device in DEVICES:
            assert rows[(device, "repaired")].verdict is not None

        archive = client.download_repaired(job.id, tmp_path / "repaired.zip")
    stack.check_alive()

    with zipfile.ZipFile(archive) as opened:
        assert "massive.repaired.mlpackage/Manifest.json" in opened.namelist()
        opened.extractall(tmp_path / "repaired")
    repaired = tmp_path / "repaired" / "massive.repaired.mlpackage"
    import coremltools as ct

    from decodebench.building.job import check_finite_decode
    from decodebench.doctor.repair import REPAIR_METADATA_KEY

    loaded = ct.models.MLModel(str(repaired), skip_model_load=True)
    assert "norms made overflow-safe" in loaded.user_defined_metadata[REPAIR_METADATA_KEY]
    check_finite_decode(repaired)  # the original's decode is not finite; the repair's is

    sign_in(stack, page, f"/doctor/{job.id}")
    text = page.inner_text("main") if page.query_selector("main") else page.inner_text("body")
    assert "First non-finite value in fp16: layer 1 · input norm · square" in text
    assert "SIMULATED" in text and "(predicted)" in text
    assert "Agreement with the checkpoint's transformers fp32" in text
    assert page.get_attribute("#download", "href") == f"/doctor/{job.id}/download"
    assert page.inner_text("#repaired-model") == "massive.repaired"
    problems = check_pages(stack, page, {"doctor": f"/doctor/{job.id}", "doctor-jobs": "/doctor"})
    assert problems == {}


def test_a_tokenizer_the_package_has_no_logits_for_fails_the_job_naming_both(
    stack: Stack, tmp_path: Path, capsys
) -> None:
    """The worker's code in this process against the server process: a package with a
    128-token vocabulary and SmolLM2's tokenizer (ids up to 49,151) is refused before decoding."""
    from worker.config import WorkerSettings
    from worker.doctor import run_doctor

    package = massive_channel_package(tmp_path / "package", vocab_size=128)
    user = ["--server", stack.server_url, "--token", stack.tokens["user"]]
    assert main(["model", "upload", str(package), "--name", "small-vocab", *user]) == 0
    with DecodebenchClient(stack.server_url, stack.tokens["user"]) as client:
        job = client.submit_doctor({"package": "small-vocab", "devices": DEVICES[:1], "prompts": 1})
        settings = WorkerSettings(
            server_url=stack.server_url,
            worker_token=stack.tokens["worker"],
            work_dir=tmp_path / "w",
        )
        assert run_doctor(job.id, settings).startswith("failed: ")
        failed = client.get_doctor(job.id)
    assert failed.state == "failed" and failed.report is None and failed.sweep_id is None
    assert failed.error is not None
    assert "tokenizer: smollm2-135m encodes the prompts with token ids up to" in failed.error
    assert "the package's vocabulary has 128 tokens" in failed.error
    assert query("SELECT id FROM models WHERE name LIKE '%.repaired'") == []
