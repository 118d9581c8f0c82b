"""From nightly values to alerts: suspect a change, ask for a re-run, confirm or dismiss.

A series is one (schedule, variant, device class): one value per night, oldest first, typically
the sweep's mean decode tok/s over every prompt of every run. Each night:

1. `suspect_change(series)` runs E-divisive change-point detection (decodebench.judging.
   changepoints) over the trailing window; a change point that starts within the newest
   `lookback` nights, is significant and at least `min_effect` in size is a **suspected change**
   that needs a confirmation re-run on the same builds before anyone is told.
2. `confirm_change(suspect, rerun_values)`: the re-run is **confirmed** when it, too, differs
   from the level before the change by at least `min_effect` in the same direction and
   significantly (t-test against the nights before); otherwise the suspicion is **dismissed**
   (a noisy night, not a change).
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from decodebench.contracts.verdicts import DEFAULT_MIN_EFFECT, MAX_MIN_EFFECT, JudgingError
from decodebench.judging.changepoints import (
    ChangePoint,
    best_cut,
    change_points,
    t_test_pvalue,
    tested_cut,
)


class DetectionSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    min_effect: float = Field(
        default=DEFAULT_MIN_EFFECT,
        ge=0,
        le=MAX_MIN_EFFECT,
        description="Band: smaller is no change",
    )
    max_pvalue: float = Field(default=0.001, gt=0, lt=1, description="Change-point significance")
    confirm_pvalue: float = Field(
        default=0.01, gt=0, lt=1, description="Significance the re-run must reach on its own"
    )
    window: int = Field(default=30, ge=4, description="Nights the detection looks back over")
    lookback: int = Field(default=2, ge=1, description="A new change must start this recently")
    min_history: int = Field(default=8, ge=2, description="Nights of a level before judging it")
    higher_is_better: bool = Field(default=True, description="True for tok/s, False for TTFT")


class Direction(StrEnum):
    regression = "regression"
    improvement = "improvement"


class SuspectedChange(BaseModel):
    """A change the detection saw in the newest nights; nobody is told before a re-run."""

    model_config = ConfigDict(frozen=True)

    status: str = "needs confirmation re-run"
    index: int = Field(description="Position in the series of the first night of the new level")
    direction: Direction
    relative_change: float = Field(description="mean after / mean before - 1")
    mean_before: float
    mean_after: float
    pvalue: float
    before: tuple[float, ...] = Field(description="The nights of the level before the change")


class Outcome(StrEnum):
    confirmed = "confirmed"
    dismissed = "dismissed"


class Confirmation(BaseModel):
    model_config = ConfigDict(frozen=True)

    outcome: Outcome
    suspect: SuspectedChange
    rerun_mean: float
    rerun_relative_change: float
    pvalue: float
    reason: str


def _direction(relative_change: float, higher_is_better: bool) -> Direction:
    return (
        Direction.improvement if (relative_change > 0) == higher_is_better else Direction.regression
    )


def _checked(values: Sequence[float], what: str) -> np.ndarray:
    array = np.asarray(values, dtype=float)
    if array.ndim != 1:
        raise JudgingError(f"{what} must be a flat list of numbers")
    bad = np.flatnonzero(~np.isfinite(array) | (array <= 0))
    if len(bad):
        raise JudgingError(f"{what} value {int(bad[0])} is {array[bad[0]]!r}; need finite > 0")
    return array


def _newest_change(
    window: np.ndarray, settings: DetectionSettings
) -> tuple[ChangePoint, int] | None:
    """The newest change point and where the level before it starts.

    E-divisive's split/merge finds the levels of the window. A change on the newest night or
    two can be lost in the merge (spurious weak cuts next to it leave it one-value segments
    whose t-test says nothing), so the newest level is also cut once more on its own: its best
    E-divisive cut, tested between the whole level and the nights after the cut.
    """
    points = change_points(
        window,
        window=settings.window,
        max_pvalue=settings.max_pvalue,
        min_magnitude=settings.min_effect,
    )
    recent = len(window) - settings.lookback
    if points and points[-1].index >= recent:
        return points[-1], points[-2].index if len(points) > 1 else 0
    level_start = points[-1].index if points else 0
    level = window[level_start:]
    if len(level) < 2:
        return None
    cut, qhat = best_cut(level)
    if level_start + cut < recent:
        return None
    return tested_cut(window, level_start + cut, qhat, level_start, len(window)), level_start


def suspect_change(
    series: Sequence[float], settings: DetectionSettings | None = None
) -> SuspectedChange | None:
    """A change starting in the newest nights of `series`, or None."""
    settings = settings or DetectionSettings()
    values = _checked(series, "series")
    offset = max(0, len(values) - settings.window)
    window = values[offset:]
    newest = _newest_change(window, settings)
    if newest is None:
        return None
    point, level_start = newest
    if (
        len(window) - point.index > settings.lookback
        or point.index - level_start < settings.min_history
    ):
        return None
    if point.pvalue > settings.max_pvalue or abs(point.forward_change) < settings.min_effect:
        return None
    before = window[level_start : point.index]
    return SuspectedChange(
        index=offset + point.index,
        direction=_direction(point.forward_change, settings.higher_is_better),
        relative_change=point.forward_change,
        mean_before=point.mean_before,
        mean_after=point.mean_after,
        pvalue=point.pvalue,
        before=tuple(float(value) for value in before),
    )


def confirm_change(
    suspect: SuspectedChange,
    rerun_values: Sequence[float],
    settings: DetectionSettings | None = None,
) -> Confirmation:
    """The re-run's verdict on a suspected change: confirmed, or dismissed as noise."""
    settings = settings or DetectionSettings()
    rerun = _checked(rerun_values, "re-run")
    if not len(rerun):
        raise JudgingError("a confirmation needs at least one re-run value")
    rerun_mean = float(rerun.mean())
    relative = rerun_mean / suspect.mean_before - 1
    pvalue = t_test_pvalue(np.asarray(suspect.before), rerun)
    same_direction = _direction(relative, settings.higher_is_better) is suspect.direction
    if not same_direction or abs(relative) < settings.min_effect:
        outcome = Outcome.dismissed
        reason = (
            f"re-run is {relative:+.2%} from the level before, within the "
            f"{settings.min_effect:.0%} band or the other way"
        )
    elif pvalue > settings.confirm_pvalue:
        outcome = Outcome.dismissed
        reason = f"re-run is {relative:+.2%} but not significant (p = {pvalue:.3g})"
    else:
        outcome = Outcome.confirmed
        reason = f"re-run is {relative:+.2%} from the level before (p = {pvalue:.3g})"
    return Confirmation(
        outcome=outcome,
        suspect=suspect,
        rerun_mean=rerun_mean,
        rerun_relative_change=relative,
        pvalue=pvalue,
        reason=reason,
    )


def series_after(series: Sequence[float], confirmation: Confirmation) -> list[float]:
    """The series to judge from the next night on: after a confirmed change the new level is
    the baseline (the nights before it leave); after a dismissal the suspected nights are set
    aside as noise."""
    index = confirmation.suspect.index
    if confirmation.outcome is Outcome.confirmed:
        return list(series[index:])
    return list(series[:index])
