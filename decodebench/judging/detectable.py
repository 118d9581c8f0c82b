"""The smallest step a nightly series confirms within a few nights, at its spread and runs per
night: what the adaptive judging can see before it is asked to."""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field
from scipy import special

from decodebench.contracts.verdicts import JudgingError
from decodebench.judging.adaptive import AdaptiveSettings, Spread


class DetectableEffect(BaseModel):
    model_config = ConfigDict(frozen=True)

    effect: float = Field(description="Smallest step confirmable within `nights` nights")
    runs_per_night: int
    nights: int
    power: float
    min_effect: float
    warning: str | None = Field(description="Set when the effect is above min_effect")


def minimum_detectable_effect(
    spread: Spread,
    runs_per_night: int,
    settings: AdaptiveSettings,
    *,
    history_nights: int | None = None,
    nights: int = 2,
    power: float = 0.95,
) -> DetectableEffect:
    """The smallest step the series confirms within `nights` nights at `power`, at its spread
    and runs per night: a shift test at `suspect_pvalue` between `history_nights` nights before
    (min_history by default) and `nights` after, whose re-runs also confirm it (one-sided)."""
    if runs_per_night < 1:
        raise JudgingError(f"runs_per_night is {runs_per_night}; it must be at least 1")
    if not 0.5 < power < 1:
        raise JudgingError(f"power is {power}; it must be in (0.5, 1)")
    before = history_nights or settings.min_history
    variance = spread.night_variance(runs_per_night)
    standard_error = math.sqrt(variance / nights + variance / before)
    z_alpha = float(special.ndtri(1 - settings.suspect_pvalue / 2))
    z_power = float(special.ndtri(power))
    effect = math.expm1((z_alpha + z_power) * standard_error)
    warning = None
    if effect > settings.min_effect:
        warning = (
            f"the smallest step confirmable within {nights} nights at {power:.0%} power is "
            f"{effect:.1%}, above min_effect {settings.min_effect:.1%}: at a run-to-run spread "
            f"of {spread.run:.1%} and {runs_per_night} runs a night, smaller changes go unseen "
            "or take longer (raise the repetitions or the budget)"
        )
    return DetectableEffect(
        effect=effect,
        runs_per_night=runs_per_night,
        nights=nights,
        power=power,
        min_effect=settings.min_effect,
        warning=warning,
    )
