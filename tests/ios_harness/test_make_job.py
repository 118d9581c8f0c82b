"""ios_harness/make_job.py writes a job the harness accepts, for a manual smoke test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from decodebench.harness import HarnessJob
from tests.support.paths import ROOT


def make_job(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "ios_harness" / "make_job.py"), *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=False,
    )


def test_a_smoke_job_fits_the_build_and_names_where_the_package_goes(tmp_path: Path) -> None:
    report = {
        "model": "tiny-gqa",
        "variant": {"attention": "folded", "kv": "input", "context": 64},
        "analysis": {"bytes_per_token": {"total": 1234}},
    }
    (tmp_path / "build.json").write_text(json.dumps(report))

    done = make_job(str(tmp_path), "--prompts", "3", "--decode-tokens", "8")

    assert done.returncode == 0, done.stderr
    job = HarnessJob.model_validate_json(done.stdout)
    assert job.package_path == "models/smoke/model.mlpackage"
    assert job.variant is not None and job.variant.kv == "input"
    assert [len(prompt.token_ids) + 8 - 1 <= 64 for prompt in job.prompts] == [True] * 3


def test_a_core_ai_build_gets_a_coreai_job_or_a_one_line_refusal(tmp_path: Path) -> None:
    """The job names the .aimodel with engine coreai; until decodebench/harness.py accepts
    that engine, make_job refuses it in one line naming it (never a Core ML job for it)."""
    report = {
        "model": "tiny-gqa",
        "variant": {"attention": "folded", "kv": "input", "context": 64},
        "analysis": {"bytes_per_token": {"total": 1234}},
    }
    (tmp_path / "build.json").write_text(json.dumps(report))
    (tmp_path / "model.aimodel").mkdir()

    done = make_job(str(tmp_path), "--prompts", "1", "--decode-tokens", "4")

    if done.returncode == 0:
        job = HarnessJob.model_validate_json(done.stdout)
        assert (job.engine, job.package_path) == ("coreai", "models/smoke/model.aimodel")
    else:
        assert done.returncode == 2 and "engine coreai" in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1


def test_a_folder_without_build_json_is_a_one_line_error(tmp_path: Path) -> None:
    done = make_job(str(tmp_path))

    assert done.returncode == 2
    assert done.stderr.startswith("make_job: ") and "build.json" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
