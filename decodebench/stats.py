"""Small statistics used wherever measured rates are summarised."""

from __future__ import annotations

import math
from collections.abc import Sequence

from pydantic import BaseModel

# Two-sided 95% Student t quantiles for 1..30 degrees of freedom; the normal value beyond.
_T95 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


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


def t95(degrees_of_freedom: int) -> float:
    if degrees_of_freedom < 1:
        return math.inf
    return _T95[degrees_of_freedom - 1] if degrees_of_freedom <= len(_T95) else 1.960


def summarize(values: Sequence[float]) -> Summary:
    """Mean with a 95% confidence interval (Student t), for samples of one or more values."""
    if not values:
        raise ValueError("cannot summarise an empty sample")
    n = len(values)
    mean = math.fsum(values) / n
    if n == 1:
        return Summary(n=1, mean=mean, stdev=0.0, ci95_half_width=0.0)
    variance = math.fsum((value - mean) ** 2 for value in values) / (n - 1)
    stdev = math.sqrt(variance)
    return Summary(n=n, mean=mean, stdev=stdev, ci95_half_width=t95(n - 1) * stdev / math.sqrt(n))
