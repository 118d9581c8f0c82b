"""The API's shapes of schedules, firings, alerts and series."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from decodebench.contracts.domain import SweepSpec
from decodebench.contracts.schedules import (
    AlertStatus,
    AlertView,
    DetectableEffectView,
    FiringView,
    NightlyValue,
    ScheduleView,
    SeriesView,
)
from decodebench.judging.detectable import minimum_detectable_effect
from server import tenancy
from server.models import Alert, DeviceSpread, Schedule, ScheduleFiring
from server.schedules.context import cell_key
from server.schedules.detection import settings_of
from server.schedules.service import next_due
from server.schedules.spread import as_spread, spread_view, stored_spread


def schedule_view(schedule: Schedule) -> ScheduleView:
    return ScheduleView(
        id=schedule.id,
        name=schedule.name,
        spec=SweepSpec.model_validate(schedule.spec),
        cron=schedule.cron,
        timezone=schedule.timezone,
        min_effect=schedule.min_effect,
        owner=schedule.owner,
        enabled=schedule.enabled,
        webhook_url=schedule.webhook_url,
        budget=schedule.budget,
        next_due_at=next_due(schedule, datetime.now(UTC)),
        created_at=schedule.created_at,
    )


def firing_view(firing: ScheduleFiring) -> FiringView:
    return FiringView(
        id=firing.id,
        schedule_id=firing.schedule_id,
        due_at=firing.due_at,
        trigger=firing.trigger,
        sweep_id=firing.sweep_id,
        completed_at=firing.completed_at,
        context=firing.context,
    )


def alert_view(alert: Alert) -> AlertView:
    return AlertView(
        id=alert.id,
        schedule_id=alert.schedule_id,
        variant=alert.variant,
        device_class=alert.device_class,
        direction=alert.direction,
        status=AlertStatus(alert.status),
        last_good_sweep_id=alert.last_good_sweep_id,
        first_bad_sweep_id=alert.first_bad_sweep_id,
        confirmation_sweep_id=alert.confirmation_sweep_id,
        relative_change=alert.suspect["relative_change"],
        confirmation=alert.confirmation,
        ratio=alert.ratio,
        changed=alert.changed,
        build_diff=alert.build_diff,
        created_at=alert.created_at,
        decided_at=alert.decided_at,
    )


def list_alerts(
    session: Session, schedule_id: int | None = None, status: AlertStatus | None = None
) -> list[AlertView]:
    query = select(Alert).where(tenancy.alerts(session)).order_by(Alert.id.desc()).limit(200)
    if schedule_id is not None:
        query = query.where(Alert.schedule_id == schedule_id)
    if status is not None:
        query = query.where(Alert.status == status.value)
    return [alert_view(alert) for alert in session.scalars(query)]


def schedule_series(session: Session, schedule: Schedule) -> list[SeriesView]:
    """Per variant x device class: every finished night's mean with its interval, and alerts."""
    spec = SweepSpec.model_validate(schedule.spec)
    nights = session.scalars(
        select(ScheduleFiring)
        .where(ScheduleFiring.schedule_id == schedule.id, ScheduleFiring.completed_at.is_not(None))
        .order_by(ScheduleFiring.due_at)
    ).all()
    alerts: dict[str, list[AlertView]] = defaultdict(list)
    for alert in reversed(list_alerts(session, schedule.id)):
        alerts[cell_key(alert.variant, alert.device_class)].append(alert)
    series = []
    for device_class in spec.devices:
        for variant in spec.variants:
            key = cell_key(variant.label, device_class)
            values = [
                NightlyValue(
                    firing_id=night.id,
                    sweep_id=night.sweep_id,
                    due_at=night.due_at,
                    mean=(night.values or {})[key]["mean"],
                    ci95_half_width=(night.values or {})[key]["ci95_half_width"],
                    runs=_cell(night, key).get("runs_spent"),
                    adaptive=_call_text(_cell(night, key)),
                )
                for night in nights
                if night.sweep_id is not None and key in (night.values or {})
            ]
            spread = stored_spread(session, schedule.project_id, device_class)
            series.append(
                SeriesView(
                    variant=variant.label,
                    device_class=device_class,
                    values=values,
                    alerts=alerts.get(key, []),
                    spread=spread_view(spread) if spread else None,
                    detectable=_detectable(schedule, spread, values) if spread else None,
                )
            )
    return series


def _cell(night: ScheduleFiring, key: str) -> dict[str, Any]:
    return (night.adaptive or {}).get(key) or {}


def _call_text(cell: dict[str, Any]) -> str | None:
    return f"{cell['call']}: {cell.get('reason', '')}" if "call" in cell else None


def _detectable(
    schedule: Schedule, spread: DeviceSpread, values: list[NightlyValue]
) -> DetectableEffectView | None:
    """The smallest step the series confirms within 2 nights at 95% power, at the learned
    spread and its runs per night (the mean of its last 10 nights, else the spec's)."""
    settings = settings_of(schedule)
    recent = [value.runs for value in values[-10:] if value.runs]
    runs = round(sum(recent) / len(recent)) if recent else settings.base_runs
    if spread.run_spread <= 0 and spread.night_spread <= 0:
        return None
    effect = minimum_detectable_effect(as_spread(spread), max(runs, 1), settings)
    return DetectableEffectView(
        effect=effect.effect,
        runs_per_night=effect.runs_per_night,
        min_effect=effect.min_effect,
        warning=effect.warning,
    )
