"""E-divisive change points against Apache Otava's output, and the nightly suspect/confirm step."""

from __future__ import annotations

import json

import numpy as np
import pytest

from decodebench.contracts.verdicts import JudgingError
from decodebench.judging.changepoints import best_cut, change_points, energy_divergence
from decodebench.judging.nightly import (
    DetectionSettings,
    Direction,
    Outcome,
    confirm_change,
    series_after,
    suspect_change,
)
from tests.support.paths import DATA

REFERENCE = json.loads((DATA / "otava_changepoints.json").read_text())


def test_the_reference_covers_series_with_and_without_changes() -> None:
    cases = REFERENCE["cases"]
    assert len(cases) == 60
    assert 10 < sum(bool(case["otava_change_points"]) for case in cases) < 50


@pytest.mark.parametrize("case", REFERENCE["cases"], ids=lambda case: f"n{len(case['values'])}")
def test_change_points_are_the_ones_apache_otava_finds(case: dict) -> None:
    values = np.array(case["values"])

    index, qhat = best_cut(values)
    assert [index, qhat] == pytest.approx(case["otava_best_cut"], rel=1e-9)
    found = change_points(
        values,
        window=case["window"],
        max_pvalue=case["max_pvalue"],
        min_magnitude=case["min_magnitude"],
    )
    assert [point.index for point in found] == case["otava_change_points"]


def test_energy_divergence_by_hand() -> None:
    # x = [0, 0], y = [3]: 2/3 * (3 + 3) - 0 - 0 = 4 (both within sums are zero).
    q = energy_divergence(np.array([0.0, 0.0, 3.0]))
    assert q[1, 1] == pytest.approx(4.0)
    # x = [0], y = [0, 3]: 2/3 * 3 - 0 - 2 * 1 / (3 * 1) * 3 = 0.
    assert q[0, 1] == pytest.approx(0.0)
    assert q[1, 0] == -np.inf  # tau must be below kappa


def test_a_clean_step_is_found_where_it_starts_and_a_flat_series_has_none() -> None:
    rng = np.random.default_rng(3)
    steady = 100 + rng.normal(0, 0.5, 20)
    stepped = np.concatenate([steady, 90 + rng.normal(0, 0.5, 10)])

    [point] = change_points(stepped)
    assert point.index == 20
    assert point.forward_change == pytest.approx(-0.10, abs=0.01)
    assert change_points(steady) == []
    assert change_points([5.0]) == []


@pytest.mark.parametrize(
    ("series", "options", "message"),
    [
        ([1.0, float("nan"), 2.0], {}, "series value 1 is not finite"),
        ([1.0, 2.0, 3.0], {"window": 1}, "window"),
        ([1.0, 2.0, 3.0], {"max_pvalue": 0}, "max_pvalue"),
    ],
)
def test_bad_series_are_refused(series: list[float], options: dict, message: str) -> None:
    with pytest.raises(JudgingError, match=message):
        change_points(series, **options)


# Suspect, re-run, confirm or dismiss


def nights(level: float, count: int, seed: int, spread: float = 0.01) -> list[float]:
    return list(level * (1 + spread * np.random.default_rng(seed).standard_normal(count)))


def test_a_drop_on_the_newest_night_needs_a_confirmation_re_run() -> None:
    series = nights(100, 20, seed=1) + [93.0]

    suspect = suspect_change(series)

    assert suspect is not None and suspect.status == "needs confirmation re-run"
    assert suspect.index == 20 and suspect.direction is Direction.regression
    assert suspect.relative_change == pytest.approx(93 / np.mean(series[:20]) - 1)
    assert len(suspect.before) == 20
    confirmed = confirm_change(suspect, [93.5])
    assert confirmed.outcome is Outcome.confirmed
    assert confirmed.rerun_relative_change == pytest.approx(-0.065, abs=0.01)
    dismissed = confirm_change(suspect, [99.8])
    assert dismissed.outcome is Outcome.dismissed and "band" in dismissed.reason
    assert confirm_change(suspect, [104.0]).outcome is Outcome.dismissed  # the other way
    assert series_after(series, confirmed) == [93.0]  # the new level is the baseline
    assert series_after(series, dismissed) == series[:20]  # the noisy night is set aside


def test_a_quiet_history_and_a_change_below_the_band_raise_nothing() -> None:
    assert suspect_change(nights(100, 40, seed=2)) is None
    small = nights(100, 20, seed=3, spread=0.001) + [98.7, 98.8]
    assert suspect_change(small) is None  # resolved, but 1.3% is inside the 2% band
    assert suspect_change(small, DetectionSettings(min_effect=0.01)) is not None


def test_an_old_change_is_not_suspected_again() -> None:
    series = nights(100, 15, seed=4) + nights(92, 6, seed=5)

    assert suspect_change(series) is None  # it starts 6 nights back, beyond the lookback
    assert suspect_change(series[:17]) is not None


def test_direction_follows_what_is_better() -> None:
    series = nights(100, 15, seed=6) + [108.0, 108.5]

    assert suspect_change(series).direction is Direction.improvement
    ttft = DetectionSettings(higher_is_better=False)
    assert suspect_change(series, ttft).direction is Direction.regression


def test_too_short_a_level_is_not_judged() -> None:
    assert suspect_change(nights(100, 5, seed=7) + [80.0]) is None


def test_bad_nightly_input_is_refused() -> None:
    with pytest.raises(JudgingError, match="series value 2"):
        suspect_change([100.0, 100.0, -1.0])
    suspect = suspect_change(nights(100, 20, seed=1) + [93.0])
    with pytest.raises(JudgingError, match="at least one re-run"):
        confirm_change(suspect, [])
    with pytest.raises(ValueError, match="min_effect"):
        DetectionSettings(min_effect=0.7)


def test_the_t_test_is_scipys_ttest_ind_from_stats_with_population_deviations() -> None:
    from scipy.stats import ttest_ind_from_stats

    from decodebench.judging.changepoints import t_test_pvalue

    rng = np.random.default_rng(8)
    for _ in range(200):
        left = rng.normal(0, 1, int(rng.integers(2, 30)))
        right = rng.normal(rng.normal(), 1, int(rng.integers(1, 30)))
        expected = ttest_ind_from_stats(
            left.mean(), left.std(), len(left), right.mean(), right.std(), len(right)
        ).pvalue
        assert t_test_pvalue(left, right) == pytest.approx(expected, rel=1e-9)
