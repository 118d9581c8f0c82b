"""Least-squares calibration of a device profile from measured runs (no server)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from pydantic import ValidationError

from decodebench.calibration import CalibrationError, Observation, fit_profile
from decodebench.contracts.profiles import BANDWIDTH, IPHONE_17_PRO, OVERHEAD

# Three builds: (bytes moved per token, dispatched ops), like repeat_kv, folded, int4 folded.
BUILDS = {"repeat_kv": (4_824_000_000, 2_299), "folded": (2_810_000_000, 2_179),
          "int4": (900_000_000, 2_400)}  # fmt: skip
TRUE_BANDWIDTH_MB_S = 61_000.0
TRUE_OVERHEAD_US = 4.0


def true_tok_s(bytes_per_token: int, ops: int) -> float:
    return 1 / (bytes_per_token / (TRUE_BANDWIDTH_MB_S * 1e6) + ops * TRUE_OVERHEAD_US * 1e-6)


def observe(builds: dict[str, tuple[int, int]], runs: int = 3, noise: float = 0.0):
    rng = np.random.default_rng(7)
    return [
        Observation(
            build=name,
            run_id=index * runs + run,
            bytes_per_token=moved,
            dispatch_ops=ops,
            measured_tok_s=true_tok_s(moved, ops) * (1 + noise * rng.standard_normal()),
        )
        for index, (name, (moved, ops)) in enumerate(builds.items())
        for run in range(runs)
    ]


def test_exact_runs_give_back_both_parameters() -> None:
    fit = fit_profile(IPHONE_17_PRO, observe(BUILDS))
    assert fit.effective_bandwidth_mb_s == pytest.approx(TRUE_BANDWIDTH_MB_S, rel=1e-9)
    assert fit.dispatch_overhead_us == pytest.approx(TRUE_OVERHEAD_US, rel=1e-6)
    assert fit.calibrated_parameters == (BANDWIDTH, OVERHEAD)
    assert (fit.runs, fit.builds, fit.includes_simulated) == (9, 3, False)
    assert fit.rms_relative_error == pytest.approx(0, abs=1e-9)
    for point in fit.points:
        assert point.predicted_tok_s == pytest.approx(point.measured_tok_s, rel=1e-9)

    calibrated = fit.apply_to(IPHONE_17_PRO)
    assert calibrated.calibrated and calibrated.calibration_runs == 9
    assert calibrated.source == (
        "effective_bandwidth_mb_s and dispatch_overhead_us fitted from 9 measured runs of 3 builds"
    )
    assert calibrated.predicted_tok_s(2_810_000_000, 2_179) == pytest.approx(
        true_tok_s(2_810_000_000, 2_179)
    )


def test_noisy_runs_land_near_the_truth_and_report_the_error() -> None:
    fit = fit_profile(IPHONE_17_PRO, observe(BUILDS, runs=20, noise=0.01))
    assert fit.effective_bandwidth_mb_s == pytest.approx(TRUE_BANDWIDTH_MB_S, rel=0.02)
    assert fit.dispatch_overhead_us == pytest.approx(TRUE_OVERHEAD_US, rel=0.5)
    assert 0.005 < fit.rms_relative_error < 0.02


def test_one_build_fits_the_bandwidth_and_keeps_the_prior_overhead() -> None:
    prior = IPHONE_17_PRO.model_copy(update={"dispatch_overhead_us": 2.0})
    fit = fit_profile(prior, observe({"folded": BUILDS["folded"]}))
    assert fit.calibrated_parameters == (BANDWIDTH,)
    assert fit.dispatch_overhead_us == 2.0
    moved, ops = BUILDS["folded"]
    seconds = 1 / true_tok_s(moved, ops)
    assert fit.effective_bandwidth_mb_s == pytest.approx(moved / (seconds - ops * 2e-6) / 1e6)
    assert "bandwidth fitted" in fit.note


def test_builds_with_proportional_bytes_and_ops_cannot_separate_the_two() -> None:
    builds = {"small": (1_000_000_000, 1_000), "large": (2_000_000_000, 2_000)}
    fit = fit_profile(IPHONE_17_PRO, observe(builds))
    assert fit.calibrated_parameters == (BANDWIDTH,)


def test_a_negative_overhead_is_held_at_zero() -> None:
    # Faster per byte where there are more ops: only a negative overhead would fit exactly.
    runs = [
        Observation(build="a", bytes_per_token=1_000_000_000, dispatch_ops=1_000, measured_tok_s=50),
        Observation(build="b", bytes_per_token=1_000_000_000, dispatch_ops=3_000, measured_tok_s=55),
    ]  # fmt: skip
    fit = fit_profile(IPHONE_17_PRO, runs)
    assert fit.dispatch_overhead_us == 0.0
    assert fit.calibrated_parameters == (BANDWIDTH, OVERHEAD)
    assert "held at its bound 0" in fit.note
    # The bandwidth alone then fits both runs in the least-squares sense.
    assert 50_000 < fit.effective_bandwidth_mb_s < 55_000
    assert math.isfinite(fit.rms_relative_error)


def test_simulated_runs_are_labelled() -> None:
    runs = [item.model_copy(update={"simulated": True}) for item in observe(BUILDS, runs=1)]
    fit = fit_profile(IPHONE_17_PRO, runs)
    assert fit.includes_simulated
    assert "SIMULATED runs" in fit.apply_to(IPHONE_17_PRO).source


def test_impossible_calibrations_say_why() -> None:
    with pytest.raises(CalibrationError, match="no runs to calibrate from"):
        fit_profile(IPHONE_17_PRO, [])
    slow_dispatch = IPHONE_17_PRO.model_copy(update={"dispatch_overhead_us": 1_000.0})
    with pytest.raises(CalibrationError, match="exceeds the measured time per token"):
        fit_profile(slow_dispatch, observe({"folded": BUILDS["folded"]}))
    with pytest.raises(ValidationError):
        Observation(build="a", bytes_per_token=1, dispatch_ops=0, measured_tok_s=0)
