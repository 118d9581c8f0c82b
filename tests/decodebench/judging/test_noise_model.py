"""The stand-in devices' noise model (docs/noise-model.md) and the verdicts judged against it."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from decodebench.contracts.domain import SweepSpec, VariantSpec
from decodebench.contracts.profiles import IPHONE_17_PRO, DeviceNoise
from decodebench.contracts.verdicts import Verdict
from decodebench.judging.simulation import SimulatedDesign, simulated_pair
from decodebench.judging.verdicts import judge_variant
from decodebench.timing import RunNoise, TimingParameters, simulate_decode

BYTES = 1_400_000_000
PROMPTS = [20, 60, 110]


def decode(udid: str = "dev-a", run_id: int = 1, scale: float = 1.0, thermal: str = "nominal"):
    timing = TimingParameters(noise_scale=scale)
    return simulate_decode(IPHONE_17_PRO, timing, BYTES, udid, run_id, PROMPTS, 64, thermal)


def test_noise_scale_zero_is_the_bare_roofline() -> None:
    run = decode(scale=0)

    assert np.allclose(run.latencies_s, 1 / IPHONE_17_PRO.predicted_tok_s(BYTES))
    assert run.noise.offset == 1.0


def test_a_device_keeps_its_offset_across_runs_and_runs_draw_their_own() -> None:
    first, second, other_device = decode(run_id=1), decode(run_id=2), decode("dev-b", 1)

    assert first.noise.device_factor == second.noise.device_factor
    assert first.noise.device_factor != other_device.noise.device_factor
    assert first.noise.run_factor != second.noise.run_factor
    assert np.array_equal(first.latencies_s, decode(run_id=1).latencies_s)  # seeded


def test_offsets_spread_by_the_profile_figures() -> None:
    noise = IPHONE_17_PRO.noise
    devices = [RunNoise(noise, 1.0, f"dev-{i}", 1, "nominal").device_factor for i in range(2000)]
    runs = [RunNoise(noise, 1.0, "dev-a", i, "nominal").run_factor for i in range(2000)]

    assert np.std(np.log(devices)) == pytest.approx(noise.device_spread, rel=0.1)
    assert np.std(np.log(runs)) == pytest.approx(noise.run_spread, rel=0.1)
    assert np.mean(runs) == pytest.approx(1.0, abs=0.002)


def test_token_jitter_and_stalls_follow_the_profile() -> None:
    noise = DeviceNoise(outlier_rate=0.01)
    run_noise = RunNoise(noise, 1.0, "dev-a", 1, "nominal")
    factors = run_noise.factors(np.random.default_rng(0), np.full(100_000, 1e-6))
    relative = factors / run_noise.offset
    stalls = relative[relative > 3]
    calm = np.log(relative[relative <= 3])

    assert len(stalls) / len(factors) == pytest.approx(0.01, rel=0.15)
    assert stalls.min() >= 5 * 0.85 and stalls.max() <= 20 * 1.15  # 5-20x, times the jitter
    assert np.std(calm) == pytest.approx(noise.token_jitter, rel=0.05)


def test_thermal_slowdown_grows_with_sustained_work_and_the_thermal_state() -> None:
    noise = RunNoise(IPHONE_17_PRO.noise, 1.0, "dev-a", 1, "serious")
    slowdown = IPHONE_17_PRO.noise.slowdown("serious")

    assert noise.thermal_factor(0.0) == 1.0
    assert noise.thermal_factor(300.0) == pytest.approx(1 + slowdown * (1 - np.exp(-1)))
    assert noise.thermal_factor(1e6) == pytest.approx(1 + slowdown)
    nominal, serious = decode(thermal="nominal"), decode(thermal="serious")
    late_ratio = serious.latencies_s[-1].mean() / nominal.latencies_s[-1].mean()
    early_ratio = serious.latencies_s[0, :8].mean() / nominal.latencies_s[0, :8].mean()
    assert late_ratio > early_ratio >= 1.0


def test_profile_noise_is_validated() -> None:
    with pytest.raises(ValidationError, match="thermal_slowdown lacks critical"):
        DeviceNoise(thermal_slowdown={"nominal": 0, "fair": 0, "serious": 0})
    with pytest.raises(ValidationError, match="outlier_factor"):
        DeviceNoise(outlier_factor=(20, 5))
    with pytest.raises(ValueError, match="noise_scale"):
        TimingParameters(noise_scale=-1)


def test_a_sweep_spec_can_scale_the_noise() -> None:
    spec = SweepSpec(
        model="tiny-gqa", variants=[VariantSpec()], devices=["iphone-17-pro"], noise_scale=0
    )
    assert spec.noise_scale == 0
    assert (
        SweepSpec(model="tiny-gqa", variants=[VariantSpec()], devices=["iphone-17-pro"]).noise_scale
        is None
    )
    with pytest.raises(ValidationError, match="noise_scale"):
        SweepSpec(
            model="tiny-gqa", variants=[VariantSpec()], devices=["iphone-17-pro"], noise_scale=-1
        )


# The verdicts of decodebench.judging against this noise, at the default scale. A B B A with
# two rounds (4 runs per variant); docs/statistics.md has the figures for other designs.

DESIGN = SimulatedDesign(repetitions=4)


def verdicts(speedup: float, seeds: range) -> list:
    rows = []
    for seed in seeds:
        baseline, variant = simulated_pair(
            IPHONE_17_PRO, TimingParameters(), DESIGN, BYTES, speedup, seed=seed
        )
        rows.append(judge_variant(baseline, variant, n_resamples=1000).decode_tok_s)
    return rows


def test_an_a_a_comparison_is_no_significant_change_in_at_least_95_percent_of_seeds() -> None:
    rows = verdicts(1.0, range(40))

    quiet = sum(row.verdict is Verdict.no_significant_change for row in rows)
    assert quiet / len(rows) >= 0.95


def test_a_five_percent_speed_up_is_detected() -> None:
    rows = verdicts(1.05, range(100, 140))

    # 0.96 over 100 seeds with 4 runs per variant, 1.00 with 8 (bench/verdict_calibration.py).
    assert sum(row.label == "faster" for row in rows) / len(rows) >= 0.85
    assert not any(row.label == "slower" for row in rows)


def test_interval_coverage_is_near_nominal() -> None:
    rows = verdicts(1.03, range(200, 260))

    coverage = sum(row.ci_low <= 1.03 <= row.ci_high for row in rows) / len(rows)
    # Nominal 0.95; 0.98 over 100 seeds (bench/verdict_calibration.py).
    assert 0.85 <= coverage <= 1.0
