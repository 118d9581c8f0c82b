"""Small statistics used wherever measured rates are summarised (quantiles from scipy)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache

from pydantic import BaseModel
from scipy import stats as scipy_stats


class Summary(BaseModel):
    n: int
    mean: float
    stdev: float
    ci95_half_width: float

    @property
    def low(self) -> float:
        return self.mean - self.ci95_half_width

    @property
    def high(self) -> float:
        return self.mean + self.ci95_half_width


@lru_cache(maxsize=1024)  # scipy's ppf costs ~0.3 ms; a page summarises dozens of cells
def t95(degrees_of_freedom: int) -> float:
    """The two-sided 95% Student t quantile; infinite when there is no degree of freedom."""
    if degrees_of_freedom < 1:
        return math.inf
    return float(scipy_stats.t.ppf(0.975, degrees_of_freedom))


def summarize(values: Sequence[float]) -> Summary:
    """Mean with a 95% confidence interval (Student t), for samples of one or more values."""
    if not values:
        raise ValueError("cannot summarise an empty sample")
    if not all(math.isfinite(value) for value in values):
        raise ValueError("cannot summarise a sample with a non-finite value")
    n = len(values)
    mean = math.fsum(values) / n
    if n == 1:
        return Summary(n=1, mean=mean, stdev=0.0, ci95_half_width=0.0)
    variance = math.fsum((value - mean) ** 2 for value in values) / (n - 1)
    stdev = math.sqrt(variance)
    return Summary(n=n, mean=mean, stdev=stdev, ci95_half_width=t95(n - 1) * stdev / math.sqrt(n))
