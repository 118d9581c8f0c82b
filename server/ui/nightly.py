"""The nightly pages' figures: each schedule's state, its firings and alerts, and per variant ×
device class the trend of nightly tok/s with its interval band and change markers."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime
from typing import Any

from markupsafe import Markup
from pydantic import BaseModel
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from decodebench.contracts.profiles import DEVICE_PROFILES
from decodebench.contracts.schedules import AlertStatus, AlertView, SeriesView
from server import tenancy
from server.models import Alert, Schedule, ScheduleFiring, Sweep
from server.schedules import service, views
from server.ui.charts import ChangeMarker, NightPoint, trend_chart

FIRINGS_SHOWN = 60


def device_name(device_class: str) -> str:
    profile = DEVICE_PROFILES.get(device_class)
    return profile.display_name if profile else device_class


def diff_page(alert: AlertView) -> str | None:
    """The page of the alert's build diff (the API gives the JSON address)."""
    return alert.build_diff.removeprefix("/api/v1") if alert.build_diff else None


def alert_text(alert: AlertView, night: datetime | None) -> str:
    status = {"confirmed": "Confirmed", "suspected": "Suspected"}.get(alert.status, "Dismissed")
    when = f" from the night of {night:%Y-%m-%d}" if night else ""
    return f"{status} {alert.direction} {alert.relative_change:+.1%}{when}: alert {alert.id}"


def ratio_text(alert: AlertView) -> str:
    """First bad against last good night, with its interval, as the verdicts say it."""
    ratio = alert.ratio or {}
    if not {"ratio", "ci_low", "ci_high"} <= ratio.keys():
        return str(ratio.get("note", "—"))
    return f"{ratio['ratio']:.3f}× [{ratio['ci_low']:.3f}, {ratio['ci_high']:.3f}] {ratio.get('label', '')}"


def _sweep_states(session: Session, sweep_ids: set[int]) -> dict[int, str]:
    if not sweep_ids:
        return {}
    return dict(session.execute(select(Sweep.id, Sweep.state).where(Sweep.id.in_(sweep_ids))).all())


def schedules_context(session: Session) -> dict[str, Any]:
    """One row per schedule: when it fires next, what its last firing did, its alerts."""
    schedules = service.list_schedules(session)
    last = {
        firing.schedule_id: firing
        for firing in session.scalars(
            select(ScheduleFiring)
            .where(
                ScheduleFiring.schedule_id.in_(
                    select(Schedule.id).where(tenancy.schedules(session))
                )
            )
            .distinct(ScheduleFiring.schedule_id)
            .order_by(ScheduleFiring.schedule_id, ScheduleFiring.due_at.desc())
        )
    }
    counts: dict[int, dict[str, int]] = defaultdict(dict)
    for schedule_id, status, count in session.execute(
        select(Alert.schedule_id, Alert.status, func.count())
        .where(tenancy.alerts(session))
        .group_by(Alert.schedule_id, Alert.status)
    ):
        counts[schedule_id][status] = count
    states = _sweep_states(session, {f.sweep_id for f in last.values() if f.sweep_id})
    now = datetime.now(UTC)
    return {
        "rows": [
            {
                "schedule": schedule,
                "next_due": service.next_due(schedule, now),
                "last": last.get(schedule.id),
                "last_state": states.get(last[schedule.id].sweep_id or 0)
                if schedule.id in last
                else None,
                "confirmed": counts[schedule.id].get(AlertStatus.confirmed.value, 0),
                "suspected": counts[schedule.id].get(AlertStatus.suspected.value, 0),
            }
            for schedule in schedules
        ]
    }


class SeriesChart(BaseModel):
    series: SeriesView
    anchor: str
    title: str
    chart: Markup | None
    marked: dict[int, list[AlertView]]  # firing id -> alerts whose first bad night it is

    model_config = {"arbitrary_types_allowed": True}


def series_chart(series: SeriesView) -> SeriesChart:
    night_of = {value.sweep_id: value for value in series.values}
    points = [
        NightPoint(
            at=value.due_at, mean=value.mean, half_width=value.ci95_half_width,
            label=f"{value.due_at:%Y-%m-%d %H:%M} (sweep {value.sweep_id})",
        )
        for value in series.values
    ]  # fmt: skip
    markers, marked = [], defaultdict(list)
    for alert in series.alerts:
        night = night_of.get(alert.first_bad_sweep_id or 0)
        if alert.status == AlertStatus.dismissed or night is None:
            continue
        marked[night.firing_id].append(alert)
        kind = alert.direction if alert.status == AlertStatus.confirmed else "suspected"
        markers.append(
            ChangeMarker(
                at=night.due_at, kind=kind, text=alert_text(alert, night.due_at),
                href=f"#alert-{alert.id}", diff_href=diff_page(alert),
            )
        )  # fmt: skip
    title = f"{series.variant} on {device_name(series.device_class)}"
    return SeriesChart(
        series=series,
        anchor=f"series-{series.variant}-{series.device_class}",
        title=title,
        chart=trend_chart(points, markers, f"Nightly decode tok/s, {title}") if points else None,
        marked=dict(marked),
    )


def schedule_context(session: Session, schedule_id: int) -> dict[str, Any]:
    schedule: Schedule = service.get_schedule(session, schedule_id)
    firings = service.firings_of(session, schedule_id)
    shown = list(reversed(firings))[:FIRINGS_SHOWN]
    alerts = views.list_alerts(session, schedule_id)
    return {
        "schedule": views.schedule_view(schedule),
        "charts": [series_chart(series) for series in views.schedule_series(session, schedule)],
        "firings": shown,
        "firings_total": len(firings),
        "sweep_states": _sweep_states(session, {f.sweep_id for f in shown if f.sweep_id}),
        "alerts": alerts,
        "night_of_sweep": {f.sweep_id: f.due_at for f in firings if f.sweep_id},
        "device_name": device_name,
        "diff_page": diff_page,
        "ratio_text": ratio_text,
    }
