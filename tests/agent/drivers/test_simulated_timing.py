"""The simulated driver's timing model (roofline, noise, profiles, prefill, load) and its
determinism."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from agent.drivers.base import Cancellation, DriverError, run_on_device
from agent.drivers.simulated import SimulatedDevice, SimulatedDriver, TimingParameters
from agent.runner import build_job
from decodebench.contracts.profiles import IPHONE_16_PRO, IPHONE_17_PRO
from tests.support.simulated import BYTES_PER_TOKEN, aggregate_tok_s, assignment_for, simulate


def test_without_noise_decode_rate_is_bandwidth_over_bytes_per_token(
    tmp_path: Path, artifact: Path
) -> None:
    result = simulate(tmp_path, artifact, noise_scale=0)
    roofline_tok_s = IPHONE_17_PRO.effective_bandwidth_bytes_s / BYTES_PER_TOKEN

    for prompt in result.prompts:
        assert prompt.decode_tok_s == pytest.approx(roofline_tok_s, rel=1e-9)
    assert "no noise" in result.timing_model


def test_with_default_noise_the_run_stays_near_the_roofline(tmp_path: Path, artifact: Path) -> None:
    result = simulate(tmp_path, artifact)
    roofline_tok_s = IPHONE_17_PRO.effective_bandwidth_bytes_s / BYTES_PER_TOKEN

    # Device and run offsets (sigma 2% and 1%) move the whole run; 15% is over 4 sigma.
    assert aggregate_tok_s(result) == pytest.approx(roofline_tok_s, rel=0.15)
    latencies = [ms for p in result.prompts for ms in p.token_latencies_ms]
    assert statistics.pstdev(latencies) / statistics.mean(latencies) > 0.02
    assert "device offset" in result.timing_model and "stalls 5-20x" in result.timing_model


def test_the_driver_times_with_the_profile_the_assignment_carries(
    tmp_path: Path, artifact: Path
) -> None:
    """The server sends its current profile (calibrated) and the build's dispatched ops with
    the run; the driver's decode time is then that profile's prediction, not the built-in one."""
    calibrated = IPHONE_17_PRO.model_copy(
        update={
            "effective_bandwidth_mb_s": 40_000.0,
            "dispatch_overhead_us": 5.0,
            "calibrated_parameters": ("effective_bandwidth_mb_s", "dispatch_overhead_us"),
            "source": "calibration 7",
        }  # fmt: skip
    )
    assignment = assignment_for(artifact).model_copy(
        update={"device_profile": calibrated, "dispatch_ops": 2_000}
    )
    driver = SimulatedDriver(
        [SimulatedDevice("sim-test-0", "iphone-17-pro")],
        tmp_path / "work",
        timing=TimingParameters(noise_scale=0),
    )
    driver.assign(driver.discover()[0], assignment)
    result = run_on_device(
        driver, driver.discover()[0], artifact, build_job(assignment), Cancellation(), 60
    )
    expected = calibrated.predicted_tok_s(BYTES_PER_TOKEN, 2_000)
    assert expected < IPHONE_17_PRO.predicted_tok_s(BYTES_PER_TOKEN) * 0.8
    for prompt in result.prompts:
        assert prompt.decode_tok_s == pytest.approx(expected, rel=1e-9)
    assert "calibration 7" in result.timing_model and "2,000" in result.timing_model

    # A profile for another class is refused, not used.
    other = assignment.model_copy(update={"device_profile": IPHONE_16_PRO, "run_id": 42})
    driver.assign(driver.discover()[0], other)
    with pytest.raises(DriverError, match="profile is for iphone-16-pro"):
        run_on_device(driver, driver.discover()[0], artifact, build_job(other), Cancellation(), 60)


def test_iphone_17_pro_is_faster_than_16_pro_by_the_profile_ratio(
    tmp_path: Path, artifact: Path
) -> None:
    fast = simulate(tmp_path / "a", artifact, "iphone-17-pro", udid="sim-a", noise_scale=0)
    slow = simulate(tmp_path / "b", artifact, "iphone-16-pro", udid="sim-b", noise_scale=0)

    ratio = aggregate_tok_s(fast) / aggregate_tok_s(slow)
    profile_ratio = IPHONE_17_PRO.effective_bandwidth_mb_s / IPHONE_16_PRO.effective_bandwidth_mb_s
    assert ratio == pytest.approx(profile_ratio, rel=1e-9)
    assert (
        ratio > 1.2
    )  # docs/device-profiles.md: the 16 Pro profile runs the same build about 21% slower


def test_prefill_processes_tokens_faster_by_the_stated_parallelism(
    tmp_path: Path, artifact: Path
) -> None:
    result = simulate(tmp_path, artifact, noise_scale=0)
    parallelism = TimingParameters().prefill_parallelism

    for prompt in result.prompts:
        assert prompt.prefill_tok_s / prompt.decode_tok_s == pytest.approx(parallelism)
        prefill_ms = prompt.prompt_tokens / prompt.prefill_tok_s * 1000
        assert prompt.ttft_ms == pytest.approx(prefill_ms + prompt.token_latencies_ms[0])


def test_longer_prompts_take_longer_to_first_token(tmp_path: Path, artifact: Path) -> None:
    prompts = sorted(simulate(tmp_path, artifact).prompts, key=lambda p: p.prompt_tokens)

    assert prompts[-1].ttft_ms > 5 * prompts[0].ttft_ms


def test_load_time_and_memory_follow_the_package_size(tmp_path: Path, artifact: Path) -> None:
    result = simulate(tmp_path, artifact)
    timing = TimingParameters()
    package_bytes = sum(
        path.stat().st_size
        for path in (tmp_path / "build" / "decoder.mlpackage").rglob("*")
        if path.is_file()
    )

    assert result.load_time_cold_ms == pytest.approx(
        timing.cold_load_fixed_ms + package_bytes / timing.cold_load_bytes_s * 1000
    )
    assert result.load_time_warm_ms == pytest.approx(
        timing.warm_load_fixed_ms + package_bytes / timing.warm_load_bytes_s * 1000
    )
    assert result.peak_memory_bytes == package_bytes + timing.runtime_overhead_bytes


# Determinism


# Determinism


def test_same_run_on_same_device_reproduces_exactly(tmp_path: Path, artifact: Path) -> None:
    first = simulate(tmp_path / "a", artifact)
    second = simulate(tmp_path / "b", artifact)

    assert first == second


def test_another_run_or_device_draws_different_jitter(tmp_path: Path, artifact: Path) -> None:
    base = simulate(tmp_path / "a", artifact)
    other_run = simulate(tmp_path / "b", artifact, run_id=42)
    other_device = simulate(tmp_path / "c", artifact, udid="sim-test-1")

    latencies = base.prompts[0].token_latencies_ms
    assert other_run.prompts[0].token_latencies_ms != latencies
    assert other_device.prompts[0].token_latencies_ms != latencies
    assert base.prompts[0].token_latencies_ms != base.prompts[1].token_latencies_ms
