"""What the simulated driver reports: honest labels, the result schema, jobs fitted to the
context, results checked against their job, cancellation and device errors."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from agent.drivers.base import Cancellation, DriverError, HarnessJob, RunCancelled, run_on_device
from agent.drivers.simulated import SimulatedDevice, SimulatedDriver, simulate_run
from agent.runner import JobError, ResultMismatch, build_job, check_result, failure_reason
from decodebench.contracts.profiles import IPHONE_17_PRO, UnknownDeviceClass
from decodebench.contracts.protocol import DeviceInfo
from decodebench.contracts.results import RunResult
from decodebench.prompts import builtin_prompts
from tests.support.simulated import BYTES_PER_TOKEN, assignment_for, simulate


def test_results_validate_and_say_they_are_simulated(tmp_path: Path, artifact: Path) -> None:
    result = simulate(tmp_path, artifact, prompts=30, decode_tokens=16)

    reloaded = RunResult.model_validate(json.loads(result.model_dump_json()))
    assert reloaded == result
    assert result.simulated is True
    assert result.driver == "simulated"
    assert result.device_udid == "sim-test-0"
    assert result.product_type == IPHONE_17_PRO.product_types[0]
    assert f"{BYTES_PER_TOKEN:,} B" in result.timing_model
    assert "55,900.0 MB/s" in result.timing_model
    assert "no model executed" in result.timing_model
    assert [p.prompt_index for p in result.prompts] == list(range(30))
    for prompt, source in zip(result.prompts, builtin_prompts(30), strict=True):
        assert prompt.generated_tokens == 16
        assert len(prompt.token_latencies_ms) == 16
        assert prompt.token_ids is None
        assert prompt.prompt_tokens == source.token_count


def test_discovered_devices_are_labelled_simulated(tmp_path: Path) -> None:
    driver = SimulatedDriver(
        [SimulatedDevice("sim-a", "iphone-16-pro"), SimulatedDevice("sim-b", "iphone-17-pro")],
        tmp_path,
    )

    devices = driver.discover()

    assert [(d.udid, d.device_class, d.product_type) for d in devices] == [
        ("sim-a", "iphone-16-pro", "iPhone17,1"),
        ("sim-b", "iphone-17-pro", "iPhone18,1"),
    ]
    assert all(d.simulated and d.driver == "simulated" for d in devices)


def test_unknown_device_class_is_refused_at_start_up(tmp_path: Path) -> None:
    with pytest.raises(UnknownDeviceClass, match="iphone-3g"):
        SimulatedDriver([SimulatedDevice("sim-x", "iphone-3g")], tmp_path)


# Jobs, results and cancellation


def test_prompts_are_left_truncated_to_fit_the_context(artifact: Path) -> None:
    job = build_job(assignment_for(artifact, context=64, decode_tokens=32))
    full = builtin_prompts(30)[3].token_ids(102400)

    assert max(len(prompt.token_ids) for prompt in job.prompts) == 32
    assert job.prompts[3].token_ids == full[-32:]
    assert len(job.prompts[0].token_ids) == builtin_prompts(1)[0].token_count


def test_a_token_budget_that_fills_the_context_is_refused(artifact: Path) -> None:
    with pytest.raises(JobError, match="leaves no room for a prompt in a 64-token context"):
        build_job(assignment_for(artifact, context=64, decode_tokens=64))


def test_results_for_another_job_are_rejected(tmp_path: Path, artifact: Path) -> None:
    result = simulate(tmp_path, artifact, prompts=5, decode_tokens=8)
    device = DeviceInfo(
        udid="sim-test-0",
        device_class="iphone-17-pro",
        product_type="iPhone18,1",
        driver="simulated",
        simulated=True,
    )
    longer = build_job(assignment_for(artifact, prompts=5, decode_tokens=16))
    more_prompts = build_job(assignment_for(artifact, prompts=6, decode_tokens=8))

    check_result(build_job(assignment_for(artifact, prompts=5, decode_tokens=8)), device, result)
    with pytest.raises(ResultMismatch, match="8 tokens generated, the job asked for 16"):
        check_result(longer, device, result)
    with pytest.raises(ResultMismatch, match="answers prompts"):
        check_result(more_prompts, device, result)
    with pytest.raises(ResultMismatch, match="expected iphone-16-pro"):
        check_result(longer, device.model_copy(update={"device_class": "iphone-16-pro"}), result)


def test_shutdown_cancels_a_run_in_flight_with_the_reason(tmp_path: Path, artifact: Path) -> None:
    shutdown = threading.Event()
    timer = threading.Timer(0.2, shutdown.set)
    timer.start()
    started = time.monotonic()

    # 30 prompts x 32 tokens at ~93 tok/s is about 11 s simulated; time_scale 1 would take that.
    with pytest.raises(RunCancelled, match="agent shutting down") as caught:
        simulate(tmp_path, artifact, cancel=Cancellation(shutdown), time_scale=1.0)

    assert time.monotonic() - started < 3
    assert failure_reason(caught.value, "running") == ("agent shutting down", True)
    assert not (tmp_path / "work" / "devices" / "sim-test-0" / "Documents").exists()


def test_time_scale_sleeps_a_fraction_of_the_simulated_time(tmp_path: Path, artifact: Path) -> None:
    started = time.monotonic()
    result = simulate(tmp_path, artifact, prompts=2, decode_tokens=8, time_scale=1.0)
    elapsed_s = time.monotonic() - started

    simulated_s = (
        result.load_time_cold_ms
        + sum(
            p.prompt_tokens / p.prefill_tok_s * 1000 + sum(p.token_latencies_ms)
            for p in result.prompts
        )
    ) / 1000
    assert simulated_s <= elapsed_s < simulated_s + 2


def test_a_job_without_bytes_per_token_fails_clearly(artifact: Path) -> None:
    job = build_job(assignment_for(artifact)).model_copy(update={"bytes_per_token": 0})

    with pytest.raises(DriverError, match="bytes_per_token is 0"):
        simulate_run(job, SimulatedDevice("sim-a", "iphone-17-pro"), package_bytes=1)


def test_device_errors_carry_the_device_log(tmp_path: Path, artifact: Path) -> None:
    driver = SimulatedDriver([SimulatedDevice("sim-a", "iphone-17-pro")], tmp_path)
    job: HarnessJob = build_job(assignment_for(artifact)).model_copy(
        update={"artifact_sha256": "0" * 64}
    )

    with pytest.raises(DriverError, match="not installed") as caught:
        run_on_device(driver, driver.discover()[0], artifact, job, Cancellation(), timeout_s=60)

    reason, retryable = failure_reason(caught.value, "running on sim-a")
    assert "installed decoder.mlpackage" in reason
    assert "device log:" in reason
    assert retryable
