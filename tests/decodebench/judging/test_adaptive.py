"""Adaptive nightly detection: the spread it learns, the runs a night asks for, shifts found
however long ago they started, confirmation by interleaved re-runs, the detectable effect."""

from __future__ import annotations

import numpy as np
import pytest

from decodebench.contracts.verdicts import JudgingError
from decodebench.judging import adaptive, detectable

SETTINGS = adaptive.AdaptiveSettings(min_effect=0.02, base_runs=4, budget=12)


def nights_of(
    rng: np.random.Generator, levels: list[float], runs: int, run_sd: float, night_sd: float = 0.0
) -> list[list[float]]:
    return [
        list(level * np.exp(rng.normal(0, night_sd) + rng.normal(0, run_sd, runs)))
        for level in levels
    ]


@pytest.mark.parametrize(("run_sd", "night_sd"), [(0.05, 0.0), (0.01, 0.02), (0.03, 0.01)])
def test_the_spread_is_recovered_from_repeated_runs(run_sd: float, night_sd: float) -> None:
    rng = np.random.default_rng(7)
    nights = nights_of(rng, [100.0] * 300, 4, run_sd, night_sd)

    spread = adaptive.estimate_spread(nights)

    assert spread.run == pytest.approx(run_sd, rel=0.1)
    assert spread.night == pytest.approx(night_sd, abs=0.2 * max(night_sd, run_sd / 2))
    assert (spread.runs, spread.nights) == (1200, 300)


def test_a_step_in_the_series_barely_moves_the_night_spread() -> None:
    rng = np.random.default_rng(3)
    nights = nights_of(rng, [100.0] * 100 + [90.0] * 100, 4, 0.02)

    assert adaptive.estimate_spread(nights).night < 0.01


def test_the_spread_needs_repeated_runs_and_positive_values() -> None:
    with pytest.raises(JudgingError, match="2 or more runs"):
        adaptive.estimate_spread([[100.0], [101.0]])
    with pytest.raises(JudgingError, match="night 1 value 0"):
        adaptive.estimate_spread([[100.0, 99.0], [-1.0, 100.0]])


def test_a_shift_missed_on_its_first_nights_is_found_later() -> None:
    """Forty nights, a 5% drop at night 20: the whole series is searched, not a recent window."""
    rng = np.random.default_rng(11)
    spread = adaptive.Spread(run=0.05, night=0.0, runs=0, nights=0)
    nights = nights_of(rng, [100.0] * 20 + [95.0] * 20, 4, 0.05)

    shift = adaptive.find_shift(nights, spread, SETTINGS)

    assert shift is not None
    assert abs(shift.index - 20) <= 1 and shift.relative_change < -0.03
    assert adaptive.find_shift(nights[:20], spread, SETTINGS) is None


def test_a_quiet_series_raises_no_shift() -> None:
    rng = np.random.default_rng(5)
    spread = adaptive.Spread(run=0.05, night=0.0, runs=0, nights=0)
    quiet = [
        adaptive.find_shift(nights_of(rng, [100.0] * 40, 4, 0.05), spread, SETTINGS)
        for _ in range(20)
    ]

    assert sum(shift is not None for shift in quiet) <= 2


def test_a_night_adds_runs_until_it_decides_or_spends_its_budget() -> None:
    spread = adaptive.Spread(run=0.05, night=0.0, runs=0, nights=0)
    history = [[100.0, 100.0, 100.0, 100.0]] * 20

    quiet = adaptive.night_call(history, [100.5, 99.5, 100.2, 99.9], spread, SETTINGS)
    ambiguous = adaptive.night_call(history, [96.0, 97.0, 96.5, 96.5], spread, SETTINGS)
    spent = adaptive.night_call(history, [97.4] * 12, spread, SETTINGS)
    moved = adaptive.night_call(history, [90.0] * 12, spread, SETTINGS, budget=12)

    assert quiet.call is adaptive.NightCall.decided
    assert ambiguous.call is adaptive.NightCall.more
    assert spent.call is adaptive.NightCall.budget_spent
    assert "budget of 12 runs spent" in spent.reason
    assert moved.call is adaptive.NightCall.decided and "outside" in moved.reason


def test_a_confirmation_confirms_dismisses_or_gives_up() -> None:
    rng = np.random.default_rng(2)
    spread = adaptive.Spread(run=0.05, night=0.0, runs=0, nights=0)
    shift = adaptive.Shift(index=20, relative_change=-0.05, z=-3.0, pvalue=0.003, nights_after=2)
    reference = list(100 * np.exp(rng.normal(0, 0.05, 40)))

    def judge(candidate: list[float], nights: int = 1) -> adaptive.ConfirmationJudgement:
        return adaptive.judge_confirmation(shift, candidate, reference, spread, SETTINGS, nights)

    slower = judge(list(90 * np.exp(rng.normal(0, 0.05, 40))))
    faster = judge(list(108 * np.exp(rng.normal(0, 0.05, 40))))
    unsure = judge(reference[:3], nights=SETTINGS.confirm_nights)

    assert slower.call is adaptive.ConfirmationCall.confirmed
    assert faster.call is adaptive.ConfirmationCall.dismissed
    assert unsure.call is adaptive.ConfirmationCall.budget_spent
    assert "budget" in unsure.reason


def test_the_detectable_effect_shrinks_with_runs_and_warns_above_min_effect() -> None:
    noisy = adaptive.Spread(run=0.05, night=0.0, runs=0, nights=0)
    calm = adaptive.Spread(run=0.005, night=0.0, runs=0, nights=0)

    two = detectable.minimum_detectable_effect(noisy, 2, SETTINGS)
    sixteen = detectable.minimum_detectable_effect(noisy, 16, SETTINGS)
    fine = detectable.minimum_detectable_effect(calm, 2, SETTINGS)

    assert two.effect > sixteen.effect > SETTINGS.min_effect > fine.effect
    assert sixteen.effect == pytest.approx(two.effect * np.sqrt(2 / 16), rel=0.05)
    assert two.warning is not None and "above min_effect 2.0%" in two.warning
    assert fine.warning is None
