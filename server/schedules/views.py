"""The API's shapes of schedules, firings, alerts and series."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from decodebench.contracts.domain import SweepSpec
from decodebench.contracts.schedules import (
    AlertStatus,
    AlertView,
    FiringView,
    NightlyValue,
    ScheduleView,
    SeriesView,
)
from server import tenancy
from server.models import Alert, Schedule, ScheduleFiring
from server.schedules.context import cell_key
from server.schedules.service import next_due


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
                    **(night.values or {})[key],
                )
                for night in nights
                if night.sweep_id is not None and key in (night.values or {})
            ]
            series.append(
                SeriesView(
                    variant=variant.label,
                    device_class=device_class,
                    values=values,
                    alerts=alerts.get(key, []),
                )
            )
    return series
