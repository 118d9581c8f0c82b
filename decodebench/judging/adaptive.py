"""Nightly detection that adapts to the measured spread.

A series is one (schedule, variant, device class); each night holds the runs it measured (each
run's mean decode tok/s over its prompts). Everything is judged on the log scale, so changes are
relative and a spread is a relative standard deviation.

- **Spread** (`estimate_spread`): run-to-run spread from the runs of one night (pooled within
  nights), night-to-night spread from the nights' means beyond what their runs explain
  (successive differences, so a step in the series barely inflates it).
- **A night's runs** (`night_call`): a night starts with the schedule's repetitions and adds
  rounds while its interval against the current level cannot decide at `min_effect`, i.e. it
  holds both "no change" and a change of `min_effect` while the estimate leans towards the
  change, up to the schedule's budget of runs per night; then it says the budget was spent.
- **A shift, wherever it is** (`find_shift`): every cut of the active series (since the last
  confirmed change) that E-divisive means proposes, plus the best cut of the newest level, is
  tested with the learned spread (each night weighted by its runs); the most significant one at
  least `min_effect` in size is suspected. A persistent shift a night did not reveal is still
  found on a later night, as evidence after it accumulates.
- **Confirmation before anyone is told** (`judge_confirmation`): the suspected first bad build
  (candidate) and the last good build (reference) are re-run interleaved, A B B A as sweeps do,
  in rounds taken from the night's budget and carried over to later nights; confirmed when the
  interval of candidate / reference excludes no change in the suspected direction and the change
  is at least `min_effect`, dismissed when the interval rules a `min_effect` change out (or the
  direction flips), still open otherwise, given up (budget spent) after `confirm_nights` nights.
- **Minimum detectable effect** (`minimum_detectable_effect`): the smallest step a series
  confirms within 2 nights at 95% power, at its spread and runs per night.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from enum import StrEnum

import numpy as np
from pydantic import BaseModel, ConfigDict, Field
from scipy import special

from decodebench.contracts.verdicts import DEFAULT_MIN_EFFECT, MAX_MIN_EFFECT, JudgingError
from decodebench.judging.changepoints import best_cut, change_points


class Spread(BaseModel):
    """Relative standard deviations of a device class's measurements."""

    model_config = ConfigDict(frozen=True)

    run: float = Field(ge=0, description="Run to run on one night (relative sd of a run's mean)")
    night: float = Field(ge=0, description="Night to night, beyond what the runs explain")
    runs: int = Field(ge=0, description="Runs the estimate read")
    nights: int = Field(ge=0, description="Nights (or sweeps) the estimate read")

    def night_variance(self, runs: int) -> float:
        """Variance of a night's log mean over `runs` runs."""
        return self.run**2 / max(runs, 1) + self.night**2


class AdaptiveSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    min_effect: float = Field(default=DEFAULT_MIN_EFFECT, gt=0, le=MAX_MIN_EFFECT)
    base_runs: int = Field(default=2, ge=1, le=64, description="Runs every night starts with")
    budget: int = Field(default=16, ge=1, le=256, description="Most runs per night and series")
    round_runs: int = Field(default=2, ge=1, description="Runs a night adds per round")
    suspect_pvalue: float = Field(default=0.01, gt=0, lt=1)
    confidence: float = Field(default=0.95, gt=0, lt=1, description="Of every interval")
    min_history: int = Field(default=8, ge=2, description="Nights of a level before judging it")
    confirm_nights: int = Field(
        default=5, ge=1, description="Nights a confirmation may take before it is given up"
    )
    higher_is_better: bool = True

    @property
    def z(self) -> float:
        return float(special.ndtri(0.5 + self.confidence / 2))


def _log_runs(values: Sequence[float], what: str) -> np.ndarray:
    array = np.asarray(values, dtype=float)
    if array.ndim != 1 or not len(array):
        raise JudgingError(f"{what} must be a non-empty flat list of numbers")
    bad = np.flatnonzero(~np.isfinite(array) | (array <= 0))
    if len(bad):
        raise JudgingError(f"{what} value {int(bad[0])} is {array[bad[0]]!r}; need finite > 0")
    return np.log(array)


def estimate_spread(nights: Sequence[Sequence[float]]) -> Spread:
    """Run-to-run and night-to-night spread from nights of repeated runs (oldest first)."""
    return estimate_pooled_spread([nights])


def estimate_pooled_spread(series: Sequence[Sequence[Sequence[float]]]) -> Spread:
    """The spread pooled over several series (e.g. one per build a device class ran), each a
    list of nights (or sweeps) of repeated runs, oldest first.

    Run to run: the pooled variance of the log runs around their night's mean. Night to night:
    half the mean squared difference of consecutive nights' log means of one series, less what
    their runs explain; consecutive differences let a step in a series add one difference, not
    its square times the nights on each side.
    """
    logs = [
        [_log_runs(night, f"series {s} night {i}") for i, night in enumerate(nights)]
        for s, nights in enumerate(series)
    ]
    every = [night for nights in logs for night in nights]
    degrees = sum(len(night) - 1 for night in every)
    if degrees < 1:
        raise JudgingError("the run-to-run spread needs a night (or sweep) with 2 or more runs")
    run_variance = sum(float(np.sum((night - night.mean()) ** 2)) for night in every) / degrees
    excess = []
    for nights in logs:
        if len(nights) >= 2:
            means = np.array([night.mean() for night in nights])
            counts = np.array([len(night) for night in nights])
            explained = run_variance * (1 / counts[1:] + 1 / counts[:-1])
            excess.extend((np.diff(means) ** 2 - explained).tolist())
    night_variance = max(0.0, float(np.mean(excess)) / 2) if excess else 0.0
    return Spread(
        run=math.sqrt(run_variance),
        night=math.sqrt(night_variance),
        runs=int(sum(len(night) for night in every)),
        nights=len(every),
    )


def _pvalue(z: float) -> float:
    return float(2 * special.ndtr(-abs(z)))


def _level(logs: Sequence[np.ndarray], spread: Spread) -> tuple[float, float]:
    """Inverse-variance weighted mean of the nights' log means, and its variance."""
    weights = np.array([1 / spread.night_variance(len(night)) for night in logs])
    means = np.array([night.mean() for night in logs])
    return float(np.sum(weights * means) / weights.sum()), float(1 / weights.sum())


class Shift(BaseModel):
    """The series changes level at night `index` (the first night of the new level)."""

    model_config = ConfigDict(frozen=True)

    index: int
    relative_change: float = Field(description="level after / level before - 1")
    z: float
    pvalue: float
    nights_after: int


def cut_shift(nights: Sequence[Sequence[float]], cut: int, spread: Spread) -> Shift:
    """The level of nights[cut:] against nights[:cut], each night weighted by its runs."""
    if not 0 < cut < len(nights):
        raise JudgingError(f"cut {cut} leaves an empty side of {len(nights)} nights")
    logs = [_log_runs(night, f"night {i}") for i, night in enumerate(nights)]
    before, before_var = _level(logs[:cut], spread)
    after, after_var = _level(logs[cut:], spread)
    z = (after - before) / math.sqrt(before_var + after_var)
    return Shift(
        index=cut,
        relative_change=math.expm1(after - before),
        z=z,
        pvalue=_pvalue(z),
        nights_after=len(nights) - cut,
    )


def _near(index: int, ignored: Collection[int]) -> bool:
    return any(abs(index - other) <= 1 for other in ignored)


def find_shift(
    nights: Sequence[Sequence[float]],
    spread: Spread,
    settings: AdaptiveSettings,
    ignored: Collection[int] = (),
) -> Shift | None:
    """The most significant shift of the active series at least `min_effect` in size, or None.

    Cuts are proposed by E-divisive means over the whole series (no window: a shift stays
    findable however long ago it started) and by the best cut of the newest level; each is
    tested at the run level with the learned spread. Cuts next to an `ignored` one (settled
    by a confirmation) are skipped, as are cuts with fewer than `min_history` nights before.
    """
    if spread.run <= 0 and spread.night <= 0:
        raise JudgingError("a spread of 0 cannot judge a shift")
    if len(nights) <= settings.min_history:
        return None
    means = np.exp([_log_runs(night, f"night {i}").mean() for i, night in enumerate(nights)])
    points = [point.index for point in change_points(means, window=len(means), max_pvalue=0.05)]
    level_start = points[-1] if points else 0
    candidates = set(points)
    if len(means) - level_start >= 2:
        candidates.add(level_start + best_cut(means[level_start:])[0])
    shifts = [
        cut_shift(nights, cut, spread)
        for cut in sorted(candidates)
        if cut >= settings.min_history and not _near(cut, ignored)
    ]
    shifts = [
        shift
        for shift in shifts
        if shift.pvalue <= settings.suspect_pvalue
        and abs(shift.relative_change) >= settings.min_effect
    ]
    return min(shifts, key=lambda shift: shift.pvalue, default=None)


class NightCall(StrEnum):
    more = "more runs"  # the interval cannot decide at min_effect yet
    decided = "decided"
    budget_spent = "budget spent"


class NightJudgement(BaseModel):
    model_config = ConfigDict(frozen=True)

    call: NightCall
    runs: int
    relative_change: float = Field(description="Tonight against the level of the active series")
    half_width: float = Field(description="Of the interval of relative_change (log scale)")
    reason: str


def night_call(
    history: Sequence[Sequence[float]],
    tonight: Sequence[float],
    spread: Spread,
    settings: AdaptiveSettings,
    budget: int | None = None,
) -> NightJudgement:
    """Whether tonight's runs decide at `min_effect` against the level of `history`.

    Decided when the interval of tonight's change excludes no change (something moved: the
    shift detection takes it), or excludes a `min_effect` change in the direction it leans, or
    the estimate lies nearer no change than `min_effect`. Otherwise more runs are asked for,
    until `budget` (the settings' by default) runs, when the budget is spent and it says so.
    """
    budget = settings.budget if budget is None else budget
    runs = _log_runs(tonight, "tonight's runs")
    if not history:
        return NightJudgement(
            call=NightCall.decided,
            runs=len(runs),
            relative_change=0.0,
            half_width=math.inf,
            reason="no level yet: the first night sets it",
        )
    logs = [_log_runs(night, f"night {i}") for i, night in enumerate(history)]
    level, level_var = _level(logs, spread)
    change = float(runs.mean()) - level
    half = settings.z * math.sqrt(spread.night_variance(len(runs)) + level_var)
    band = math.log1p(settings.min_effect)

    def judged(call: NightCall, reason: str) -> NightJudgement:
        return NightJudgement(
            call=call,
            runs=len(runs),
            relative_change=math.expm1(change),
            half_width=half,
            reason=reason,
        )

    if abs(change) > half:
        reason = f"{math.expm1(change):+.2%} is outside its interval of no change (±{half:.2%})"
    elif abs(change) + half < band:
        reason = (
            f"{math.expm1(change):+.2%} ± {half:.2%} rules out a {settings.min_effect:.0%} change"
        )
    elif abs(change) < band or abs(change) < half / settings.z:
        reason = (
            f"{math.expm1(change):+.2%} is within {settings.min_effect:.0%} or one standard "
            "error of the level: quiet"
        )
    elif len(runs) >= budget:
        return judged(
            NightCall.budget_spent,
            f"budget of {budget} runs spent: {math.expm1(change):+.2%} ± {half:.2%} "
            f"cannot decide at {settings.min_effect:.0%}",
        )
    else:
        return judged(
            NightCall.more,
            f"{math.expm1(change):+.2%} ± {half:.2%} cannot decide at {settings.min_effect:.0%}",
        )
    return judged(NightCall.decided, reason)


class ConfirmationCall(StrEnum):
    open = "open"  # more interleaved rounds needed
    confirmed = "confirmed"
    dismissed = "dismissed"
    budget_spent = "budget spent"


class ConfirmationJudgement(BaseModel):
    model_config = ConfigDict(frozen=True)

    call: ConfirmationCall
    relative_change: float = Field(description="candidate / reference - 1 over the re-runs")
    half_width: float
    candidate_runs: int
    reference_runs: int
    reason: str


def judge_confirmation(
    shift: Shift,
    candidate: Sequence[float],
    reference: Sequence[float],
    spread: Spread,
    settings: AdaptiveSettings,
    nights: int,
) -> ConfirmationJudgement:
    """The interleaved re-runs of the first bad (candidate) and last good (reference) builds.

    Interleaved on one device, the two arms share the night, so only the run-to-run spread
    counts. `nights` is how many nights the confirmation has taken so far.
    """
    if not candidate or not reference:
        return ConfirmationJudgement(
            call=ConfirmationCall.open,
            relative_change=0.0,
            half_width=math.inf,
            candidate_runs=len(candidate),
            reference_runs=len(reference),
            reason="no re-run yet",
        )
    cand, ref = _log_runs(candidate, "candidate re-runs"), _log_runs(reference, "reference re-runs")
    change = float(cand.mean() - ref.mean())
    half = settings.z * spread.run * math.sqrt(1 / len(cand) + 1 / len(ref))
    band = math.log1p(settings.min_effect)
    same_direction = (change > 0) == (shift.relative_change > 0)

    def judged(call: ConfirmationCall, reason: str) -> ConfirmationJudgement:
        return ConfirmationJudgement(
            call=call,
            relative_change=math.expm1(change),
            half_width=half,
            candidate_runs=len(cand),
            reference_runs=len(ref),
            reason=reason,
        )

    text = f"{math.expm1(change):+.2%} ± {half:.2%} over {len(cand)}+{len(ref)} re-runs"
    if same_direction and abs(change) > half and abs(change) >= band:
        return judged(ConfirmationCall.confirmed, f"confirmed: {text}")
    if (not same_direction and abs(change) > half) or abs(change) + half < band:
        return judged(
            ConfirmationCall.dismissed,
            f"dismissed: {text} rules out a {settings.min_effect:.0%} change the suspected way",
        )
    if nights >= settings.confirm_nights:
        return judged(
            ConfirmationCall.budget_spent,
            f"budget of {settings.confirm_nights} nights x {settings.budget} runs spent: "
            f"{text} cannot decide at {settings.min_effect:.0%}",
        )
    return judged(ConfirmationCall.open, f"open: {text} cannot decide yet")
