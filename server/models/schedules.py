"""Schedules, their firings, the alerts they raise and the webhooks that tell of them."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import ForeignKey, Index, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column
from sqlalchemy.types import Boolean, DateTime, Float, Integer, String, Text

from server.models.base import Base, now_column, project_column


class Schedule(Base):
    """A sweep spec run on a cron schedule, watched night after night (see server/schedules)."""

    __tablename__ = "schedules"
    __table_args__ = (UniqueConstraint("project_id", "name"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(64))
    project_id: Mapped[int] = project_column()
    spec: Mapped[dict[str, Any]]
    cron: Mapped[str] = mapped_column(String(128))
    timezone: Mapped[str] = mapped_column(String(64))
    min_effect: Mapped[float] = mapped_column(Float)
    budget: Mapped[int] = mapped_column(Integer, server_default="24")  # runs a night and series
    owner: Mapped[str] = mapped_column(String(128))
    enabled: Mapped[bool] = mapped_column(Boolean, default=True)
    webhook_url: Mapped[str | None] = mapped_column(Text)
    webhook_secret: Mapped[str | None] = mapped_column(String(256))
    created_at: Mapped[datetime] = now_column()


class ScheduleFiring(Base):
    """One due time of a schedule and the sweep it started. The unique (schedule, due time)
    is what makes a due time fire exactly once, whichever beat asks first."""

    __tablename__ = "schedule_firings"
    __table_args__ = (UniqueConstraint("schedule_id", "due_at"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    schedule_id: Mapped[int] = mapped_column(ForeignKey("schedules.id", ondelete="CASCADE"))
    due_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    trigger: Mapped[str] = mapped_column(String(16))  # cron / run-now
    sweep_id: Mapped[int | None] = mapped_column(ForeignKey("sweeps.id", ondelete="SET NULL"))
    created_at: Mapped[datetime] = now_column()
    # Filled when the sweep has finished: what it ran on, and each (variant, device) mean.
    completed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    context: Mapped[dict[str, Any] | None]
    values: Mapped[dict[str, Any] | None]
    # Per series (variant@device class): its runs' means, the runs spent, the adaptive call
    # (more runs asked, decided, budget spent) with its reason, the top-up sweeps.
    adaptive: Mapped[dict[str, Any] | None]


class Alert(Base):
    """A change in one (schedule, variant, device class) series: suspected, then confirmed or
    dismissed by a re-run on the same builds."""

    __tablename__ = "alerts"
    __table_args__ = (Index("ix_alerts_schedule", "schedule_id", "created_at"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    schedule_id: Mapped[int] = mapped_column(ForeignKey("schedules.id", ondelete="CASCADE"))
    variant: Mapped[str] = mapped_column(String(64))
    device_class: Mapped[str] = mapped_column(String(64))
    direction: Mapped[str] = mapped_column(String(16))  # regression / improvement
    status: Mapped[str] = mapped_column(String(16))  # suspected / confirmed / dismissed
    last_good_firing_id: Mapped[int] = mapped_column(ForeignKey("schedule_firings.id"))
    first_bad_firing_id: Mapped[int] = mapped_column(ForeignKey("schedule_firings.id"))
    last_good_sweep_id: Mapped[int | None] = mapped_column(Integer)
    first_bad_sweep_id: Mapped[int | None] = mapped_column(Integer)
    confirmation_sweep_id: Mapped[int | None] = mapped_column(Integer)
    suspect: Mapped[dict[str, Any]]
    confirmation: Mapped[dict[str, Any] | None]
    ratio: Mapped[dict[str, Any] | None]
    changed: Mapped[list[Any] | None]
    build_diff: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = now_column()
    decided_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class DeviceSpread(Base):
    """A device class's run-to-run and night-to-night spread (relative standard deviations),
    learned from a project's stored repeated runs (server/schedules/spread.py)."""

    __tablename__ = "device_spreads"
    __table_args__ = (UniqueConstraint("project_id", "device_class"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    project_id: Mapped[int] = project_column()
    device_class: Mapped[str] = mapped_column(String(64))
    run_spread: Mapped[float] = mapped_column(Float)
    night_spread: Mapped[float] = mapped_column(Float)
    runs: Mapped[int] = mapped_column(Integer)
    nights: Mapped[int] = mapped_column(Integer)
    learned_at: Mapped[datetime] = now_column()


class WebhookDelivery(Base):
    """One notification for a schedule's webhook; every attempt is its own row."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (Index("ix_webhook_deliveries_due", "state", "next_attempt_at"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    schedule_id: Mapped[int] = mapped_column(ForeignKey("schedules.id", ondelete="CASCADE"))
    event: Mapped[str] = mapped_column(String(32))
    payload: Mapped[dict[str, Any]]
    state: Mapped[str] = mapped_column(String(16), default="pending")  # delivered / failed
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime] = now_column()
    created_at: Mapped[datetime] = now_column()


class WebhookAttempt(Base):
    __tablename__ = "webhook_attempts"

    id: Mapped[int] = mapped_column(primary_key=True)
    delivery_id: Mapped[int] = mapped_column(
        ForeignKey("webhook_deliveries.id", ondelete="CASCADE"), index=True
    )
    attempt: Mapped[int] = mapped_column(Integer)
    status_code: Mapped[int | None] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text)
    at: Mapped[datetime] = now_column()
