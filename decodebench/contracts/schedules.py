"""Nightly schedules: what a user asks for, and what the API answers about firings and alerts."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import ConfigDict, Field, StrictFloat, StrictInt, ValidationInfo, field_validator

from decodebench.contracts.base import Contract, Incoming
from decodebench.contracts.domain import SweepSpec
from decodebench.contracts.verdicts import DEFAULT_MIN_EFFECT, MAX_MIN_EFFECT

DEFAULT_BUDGET = 24  # runs a night and series: docs/noise-model.md says what it buys
MAX_BUDGET = 256


class AlertStatus(StrEnum):
    suspected = "suspected"  # waiting for its confirmation re-run; nobody is told yet
    confirmed = "confirmed"
    dismissed = "dismissed"


class WebhookEvent(StrEnum):
    regression = "regression.confirmed"
    improvement = "improvement.confirmed"
    nightly_failed = "nightly.failed"


class ScheduleCreate(Incoming):
    """The server checks the cron expression (croniter) and the zone (zoneinfo) on arrival."""

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    spec: SweepSpec = Field(description="The sweep run at each due time; its devices included")
    cron: str = Field(max_length=128, description="Five-field cron expression, e.g. 0 2 * * *")
    timezone: str = Field(default="UTC", max_length=64, description="IANA zone the cron reads in")
    min_effect: StrictFloat = Field(
        default=DEFAULT_MIN_EFFECT,
        gt=0,
        le=MAX_MIN_EFFECT,
        description="Smallest nightly change that raises an alert (0.02 = 2%)",
    )
    webhook_url: str | None = Field(default=None, max_length=2000, pattern=r"^https?://")
    webhook_secret: str | None = Field(
        default=None, min_length=16, max_length=256, description="Key of the HMAC-SHA256 signature"
    )
    budget: StrictInt = Field(
        default=DEFAULT_BUDGET,
        ge=1,
        le=MAX_BUDGET,
        description="Most runs a night spends on one series (variant x device class): the spec's "
        "repetitions, the rounds added until the night decides at min_effect, re-runs",
    )

    @field_validator("budget")
    @classmethod
    def _covers_the_repetitions(cls, value: int, info: ValidationInfo) -> int:
        spec = info.data.get("spec")
        if spec is not None and value < spec.repetitions:
            raise ValueError(
                f"a budget of {value} runs a night is below the spec's {spec.repetitions} "
                "repetitions"
            )
        return value


class _Answer(Contract):
    model_config = ConfigDict(extra="forbid")


class ScheduleView(_Answer):
    id: int
    name: str
    spec: SweepSpec
    cron: str
    timezone: str
    min_effect: float
    owner: str
    enabled: bool
    webhook_url: str | None
    budget: int = Field(description="Most runs a night spends on one series")
    next_due_at: datetime | None = Field(description="None while paused")
    created_at: datetime


class FiringView(_Answer):
    id: int
    schedule_id: int
    due_at: datetime
    trigger: str = Field(description="cron or run-now")
    sweep_id: int | None
    completed_at: datetime | None
    context: dict[str, Any] | None = Field(description="What the sweep ran on (builds, devices)")


class AlertView(_Answer):
    id: int
    schedule_id: int
    variant: str
    device_class: str
    direction: str = Field(description="regression or improvement")
    status: AlertStatus
    last_good_sweep_id: int | None
    first_bad_sweep_id: int | None
    confirmation_sweep_id: int | None
    relative_change: float = Field(description="Suspected: mean after / mean before - 1")
    confirmation: dict[str, Any] | None = Field(description="The re-run's outcome and reason")
    ratio: dict[str, Any] | None = Field(
        description="First bad against last good sweep: decode tok/s ratio with its 95% interval"
    )
    changed: list[dict[str, Any]] | None = Field(description="Fields that differ between them")
    build_diff: str | None = Field(description="Graph diff of the two builds when they differ")
    created_at: datetime
    decided_at: datetime | None


class NightlyValue(_Answer):
    firing_id: int
    sweep_id: int
    due_at: datetime
    mean: float = Field(description="Mean decode tok/s over every prompt of every run")
    ci95_half_width: float
    runs: int | None = Field(default=None, description="Runs the night spent on the series")
    adaptive: str | None = Field(
        default=None, description="The adaptive call: decided, or the budget spent, and why"
    )


class SpreadView(_Answer):
    device_class: str
    run_spread: float = Field(description="Run to run on one device (relative sd of a run)")
    night_spread: float = Field(description="Night to night, beyond what the runs explain")
    runs: int
    nights: int = Field(description="Groups (a sweep's runs of one build on one device) read")
    learned_at: datetime


class DetectableEffectView(_Answer):
    effect: float = Field(description="Smallest step confirmable within 2 nights at 95% power")
    runs_per_night: int
    min_effect: float
    warning: str | None = Field(description="Set when the effect is above min_effect")


class SeriesView(_Answer):
    variant: str
    device_class: str
    values: list[NightlyValue]
    alerts: list[AlertView]
    spread: SpreadView | None = Field(default=None, description="The device class's, learned")
    detectable: DetectableEffectView | None = Field(
        default=None, description="At the learned spread and the series' runs per night"
    )


class TickRequest(Incoming):
    now: datetime | None = Field(
        default=None, description="Test and development only: the clock the tick reads"
    )


class TickResult(_Answer):
    fired: list[int] = Field(description="Firings this tick created (ids)")
    completed: list[int] = Field(description="Firings whose sweeps finished and were judged")
    alerts: list[int] = Field(description="Alerts raised or decided by this tick")


class DeliveryResult(_Answer):
    attempted: int
    delivered: int
