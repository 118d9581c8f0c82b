"""The host driver measures the PyTorch reference decoder on this CPU, for real."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from agent.drivers.base import Cancellation, DriverError, RunCancelled, run_on_device
from agent.drivers.host import HostDriver
from agent.runner import build_job, check_result
from decodebench.contracts.domain import VariantSpec
from decodebench.contracts.protocol import RunAssignment, RunResult

ROOT = Path(__file__).resolve().parent.parent
CONTEXT = 128


def artifact(tmp_path: Path, attention: str) -> Path:
    """A zip shaped like the worker's: build.json plus a (stand-in) package."""
    path = tmp_path / f"{attention}.zip"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(
            "build.json", json.dumps({"variant": {"attention": attention, "context": CONTEXT}})
        )
        archive.writestr("model.mlpackage/Manifest.json", "{}")
    return path


def assignment(attention: str, artifact_path: Path, run_id: int = 5) -> RunAssignment:
    variant = VariantSpec(attention=attention, context=CONTEXT)
    return RunAssignment(
        run_id=run_id,
        sweep_id=1,
        build_id=1,
        model="tiny-gqa",
        variant=variant,
        variant_label=variant.label,
        device_class="iphone-17-pro",  # a class the agent was configured with
        prompts=2,
        decode_tokens=5,
        artifact_sha256=artifact_path.stem,
        artifact_url="",
        bytes_per_token=1,
        lease_expires_at="2030-01-01T00:00:00+00:00",
        lease_seconds=60,
    )


def measure(tmp_path: Path, attention: str) -> RunResult:
    driver = HostDriver(
        tmp_path / "host", device_class="iphone-17-pro", udid="host-test", threads=1
    )
    device = driver.discover()[0]
    path = artifact(tmp_path, attention)
    job = build_job(assignment(attention, path), device)
    result = run_on_device(driver, device, path, job, Cancellation(), timeout_s=120)
    check_result(job, device, result)
    return result


def test_both_layouts_are_measured_for_real_and_agree_token_for_token(tmp_path: Path) -> None:
    from decodebench.modeling import build_model, greedy_decode
    from decodebench.presets import TINY_GQA
    from decodebench.prompts import builtin_prompts

    slow = measure(tmp_path, "repeat_kv")
    fast = measure(tmp_path, "folded")

    for result in (slow, fast):
        assert result.driver == "host" and result.simulated is False
        assert result.product_type.startswith("host-")
        assert (
            "measured on the host CPU" in result.timing_model and "1 threads" in result.timing_model
        )
        assert result.load_time_cold_ms > 0 and result.load_time_warm_ms > 0
        assert result.peak_memory_bytes > 0
        for prompt in result.prompts:
            assert all(latency > 0 for latency in prompt.token_latencies_ms)
            assert prompt.ttft_ms >= prompt.token_latencies_ms[0]
            assert prompt.decode_tok_s == pytest.approx(
                4 / (sum(prompt.token_latencies_ms[1:]) / 1000)
            )
    assert [p.token_ids for p in slow.prompts] == [p.token_ids for p in fast.prompts]
    prompt = builtin_prompts(1)[0].token_ids(TINY_GQA.vocab_size)
    expected, _ = greedy_decode(build_model(TINY_GQA, CONTEXT, "folded"), prompt, 5)
    assert fast.prompts[0].token_ids == expected


def test_a_job_for_another_layout_than_the_artifact_is_refused(tmp_path: Path) -> None:
    driver = HostDriver(tmp_path, device_class="iphone-17-pro", udid="host-test")
    device = driver.discover()[0]
    path = artifact(tmp_path, "repeat_kv")
    job = build_job(assignment("folded", path), device)

    with pytest.raises(
        DriverError, match="built with attention repeat_kv, the job asks for folded"
    ):
        run_on_device(driver, device, path, job, Cancellation(), timeout_s=60)


def test_a_cancelled_run_stops_before_measuring(tmp_path: Path) -> None:
    driver = HostDriver(tmp_path, device_class="iphone-17-pro", udid="host-test")
    device = driver.discover()[0]
    path = artifact(tmp_path, "folded")
    job = build_job(assignment("folded", path), device)
    driver.prepare(device)
    driver.install(device, path)
    driver.push(device, job)
    driver.launch(device, job)
    cancel = Cancellation()
    cancel.cancel("lease lost")

    with pytest.raises(RunCancelled, match="lease lost"):
        driver.wait(device, job, timeout_s=60, cancel=cancel)
    with pytest.raises(DriverError, match="produced no results"):
        driver.pull_results(device, job)


@pytest.mark.slow
def test_the_bench_prints_both_layouts_and_their_ratio() -> None:
    completed = subprocess.run(
        [
            sys.executable, "bench/host_decode.py", "--models", "tiny-gqa",
            "--context", "256", "--tokens", "4", "--repeats", "2", "--threads", "1",
        ],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip

    assert completed.returncode == 0, completed.stderr[-2000:]
    lines = completed.stdout.splitlines()
    assert any(line.strip().startswith("repeat_kv") and "tok/s" in line for line in lines)
    assert any(line.strip().startswith("folded") and "tok/s" in line for line in lines)
    assert any(
        "folded / repeat_kv = " in line and "same greedy tokens: yes" in line for line in lines
    )
