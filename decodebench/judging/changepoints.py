"""E-divisive change-point detection for a series of nightly values.

The method of Matteson & James ("A Nonparametric Approach for Multiple Change Point Analysis of
Multivariate Data", 2014) as Apache Otava (formerly Hunter; Fleming et al., "Hunter: Using Change
Point Detection to Hunt for Performance Regressions", ICPE 2023) applies it to performance
series:

1. **split**: over sliding windows, repeatedly cut the piece of the series whose best cut has
   the largest energy divergence Q̂; a cut stays when a two-sample Student t-test between the
   two sides (inside their piece) has p <= a relaxed threshold (10x the final one);
2. **merge**: drop, one at a time, the weakest cut (largest p above the threshold, else the
   smallest relative change below the minimum magnitude), re-testing the cuts after it; the
   survivors are finally re-tested between their final neighbours, so a reported p-value
   always describes the segments around it.

Neither library installs beside this project's pins (signal-processing-algorithms needs
numpy<2, apache-otava pins numpy 2.2 and cloud clients), so this is written here and tested
against Apache Otava's own output on the same series
(tests/decodebench/judging/test_changepoints.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict
from scipy import special

from decodebench.contracts.verdicts import JudgingError


class ChangePoint(BaseModel):
    """The series changes level at `index` (the first value of the new level)."""

    model_config = ConfigDict(frozen=True)

    index: int
    qhat: float
    pvalue: float
    mean_before: float
    mean_after: float

    @property
    def forward_change(self) -> float:
        """after / before - 1: -0.05 is a 5% drop."""
        return self.mean_after / self.mean_before - 1 if self.mean_before else 0.0

    @property
    def magnitude(self) -> float:
        backward = self.mean_before / self.mean_after - 1 if self.mean_after else 0.0
        return max(abs(self.forward_change), abs(backward))


def energy_divergence(values: np.ndarray) -> np.ndarray:
    """Q̂(τ, κ) for every cut of `values[:κ]` into `values[:τ]` and `values[τ:κ]`.

    Entry [τ - 1, κ - 2] holds Q̂ for 1 <= τ < κ <= n (other entries are -inf):
    Q̂ = 2/(n+m) Σ|x-y| - 2m/((n+m)(n-1)) Σ_{i<k}|x_i-x_k| - 2n/((n+m)(m-1)) Σ_{j<l}|y_j-y_l|
    with n = τ, m = κ - τ (a within term is 0 when its side has one value).
    """
    n = len(values)
    distances = np.abs(values[:, None] - values[None, :])
    # prefix[a, b] = sum of distances[:a, :b]: any block sum in O(1).
    prefix = np.zeros((n + 1, n + 1))
    prefix[1:, 1:] = distances.cumsum(axis=0).cumsum(axis=1)

    def block(r0: np.ndarray, r1: np.ndarray, c0: np.ndarray, c1: np.ndarray) -> np.ndarray:
        return prefix[r1, c1] - prefix[r0, c1] - prefix[r1, c0] + prefix[r0, c0]

    tau = np.arange(1, n)[:, None]
    kappa = np.arange(2, n + 1)[None, :]
    valid = tau < kappa
    tau_b, kappa_b = np.broadcast_arrays(tau, np.where(valid, kappa, tau + 1))
    zero = np.zeros_like(tau_b)
    between = block(zero, tau_b, tau_b, kappa_b)
    within_left = block(zero, tau_b, zero, tau_b) / 2
    within_right = block(tau_b, kappa_b, tau_b, kappa_b) / 2
    left_n, right_n = tau_b.astype(float), (kappa_b - tau_b).astype(float)
    total = left_n + right_n
    with np.errstate(divide="ignore", invalid="ignore"):
        left_term = np.where(left_n > 1, 2 * right_n / (total * (left_n - 1)) * within_left, 0.0)
        right_term = np.where(right_n > 1, 2 * left_n / (total * (right_n - 1)) * within_right, 0.0)
    q = 2 / total * between - left_term - right_term
    return np.where(valid, q, -np.inf)


def best_cut(values: np.ndarray) -> tuple[int, float]:
    """The cut τ (1 <= τ < n) of the piece maximising Q̂ over every κ, and that Q̂."""
    q = energy_divergence(values)
    row, _ = np.unravel_index(np.argmax(q), q.shape)
    return int(row) + 1, float(q.max())


def t_test_pvalue(left: np.ndarray, right: np.ndarray) -> float:
    """Two-sided pooled-variance Student t-test from the two sides' means and (population)
    deviations, as Otava does (`scipy.stats.ttest_ind_from_stats` with the same inputs gives the
    same p; this calls scipy's t distribution directly, being on the nightly hot path). A side
    of one value has deviation 0; two values in all give p = 1."""
    n1, n2 = len(left), len(right)
    if n1 + n2 <= 2:
        return 1.0
    degrees = n1 + n2 - 2
    pooled = ((n1 - 1) * np.var(left) + (n2 - 1) * np.var(right)) / degrees
    spread = np.sqrt(pooled * (1 / n1 + 1 / n2))
    difference = float(np.mean(left) - np.mean(right))
    if spread == 0:
        return 1.0 if difference == 0 else 0.0
    return float(2 * special.stdtr(degrees, -abs(difference) / spread))


def _bounds(points: Sequence[int], n: int) -> list[tuple[int, int]]:
    edges = [0, *sorted(points), n]
    return [(a, b) for a, b in zip(edges, edges[1:], strict=False) if a != b]


def _tested(values: np.ndarray, index: int, qhat: float, points: Sequence[int]) -> ChangePoint:
    """The change point at `index` tested between its neighbouring points (or the ends)."""
    others = sorted(p for p in points if p != index)
    start = max((p for p in others if p < index), default=0)
    stop = min((p for p in others if p > index), default=len(values))
    return tested_cut(values, index, qhat, start, stop)


def tested_cut(values: np.ndarray, index: int, qhat: float, start: int, stop: int) -> ChangePoint:
    """A cut at `index` tested between `values[start:index]` and `values[index:stop]`."""
    left, right = values[start:index], values[index:stop]
    return ChangePoint(
        index=index,
        qhat=qhat,
        pvalue=t_test_pvalue(left, right),
        mean_before=float(np.mean(left)),
        mean_after=float(np.mean(right)),
    )


def divisive(values: np.ndarray, max_pvalue: float) -> list[ChangePoint]:
    """Cut the piece with the best Q̂ while the cut is significant (one window)."""
    found: list[ChangePoint] = []
    while True:
        points = [point.index for point in found]
        candidates = []
        for start, stop in _bounds(points, len(values)):
            if stop - start > 1:
                cut, qhat = best_cut(values[start:stop])
                candidates.append((qhat, start + cut))
        if not candidates:
            return found
        qhat, index = max(candidates, key=lambda candidate: candidate[0])
        point = _tested(values, index, qhat, points)
        if point.pvalue > max_pvalue:
            return found
        found = sorted([*found, point], key=lambda p: p.index)


def split(values: np.ndarray, window: int, max_pvalue: float) -> list[ChangePoint]:
    """Weak change points: `divisive` over windows of `window` values, half a window apart."""
    step = window // 2
    points: dict[int, float] = {}
    start = 0
    while start < len(values):
        stop = min(start + window, len(values))
        found = divisive(values[start:stop], max_pvalue)
        for point in found:
            points.setdefault(start + point.index, point.qhat)
        last = start + found[-1].index if found else 0
        start = max(last, start + step)
    indexes = sorted(points)
    return [_tested(values, index, points[index], indexes) for index in indexes]


def merge(
    points: list[ChangePoint], values: np.ndarray, max_pvalue: float, min_magnitude: float
) -> list[ChangePoint]:
    """Drop the weakest point until every one is significant and at least `min_magnitude`."""
    points = list(points)
    while points:
        weakest = max(points, key=lambda point: point.pvalue)
        if weakest.pvalue < max_pvalue:
            weakest = min(points, key=lambda point: point.magnitude)
            if weakest.magnitude > min_magnitude:
                return points
        position = points.index(weakest)
        del points[position]
        indexes = [point.index for point in points]
        # Re-test the two points after the dropped one, as Otava does, so that the same points
        # are kept; change_points() re-tests every survivor on its final neighbours at the end.
        for neighbour in (position, position + 1):
            if neighbour < len(points):
                point = points[neighbour]
                points[neighbour] = _tested(values, point.index, point.qhat, indexes)
    return points


def change_points(
    series: Sequence[float] | np.ndarray,
    *,
    window: int = 50,
    max_pvalue: float = 0.001,
    min_magnitude: float = 0.0,
) -> list[ChangePoint]:
    """Change points of `series` (oldest first): split at a relaxed threshold, then merge."""
    values = np.asarray(series, dtype=float)
    if values.ndim != 1:
        raise JudgingError("a change-point series must be one-dimensional")
    if not np.all(np.isfinite(values)):
        bad = int(np.flatnonzero(~np.isfinite(values))[0])
        raise JudgingError(f"series value {bad} is not finite")
    if window < 2:
        raise JudgingError(f"window is {window}; it must be at least 2")
    if not 0 < max_pvalue < 1:
        raise JudgingError(f"max_pvalue is {max_pvalue}; it must be in (0, 1)")
    if len(values) < 2:
        return []
    relaxed = max_pvalue * 10 if max_pvalue < 0.05 else min(max_pvalue * 2, 1.0)
    kept = merge(split(values, window, relaxed), values, max_pvalue, min_magnitude)
    indexes = [point.index for point in kept]
    return [_tested(values, point.index, point.qhat, indexes) for point in kept]
