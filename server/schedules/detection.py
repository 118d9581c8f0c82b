"""From finished nightly sweeps to alerts: record each night, suspect a change, re-run the same
builds to confirm it before anyone is told (decodebench.judging.nightly does the statistics)."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from decodebench.contracts.domain import SweepSpec
from decodebench.contracts.names import SweepPriority
from decodebench.contracts.schedules import AlertStatus, WebhookEvent
from decodebench.contracts.verdicts import JudgingError
from decodebench.judging.nightly import (
    Confirmation,
    DetectionSettings,
    Outcome,
    SuspectedChange,
    confirm_change,
    suspect_change,
)
from server.models import Alert, Schedule, ScheduleFiring, Sweep, SweepState
from server.schedules.context import cell_key, nightly_values, sweep_context, what_changed
from server.schedules.webhooks import alert_payload, failed_payload, notify
from server.sweeps.service import get_sweep, submit_sweep
from server.sweeps.verdicts import verdicts_against_sweep

FINISHED = (SweepState.completed, SweepState.failed)


def record_finished_nights(session: Session) -> tuple[list[ScheduleFiring], list[Alert]]:
    """Every firing whose sweep has just finished: its context and values, then detection."""
    finished = session.scalars(
        select(ScheduleFiring)
        .join(Sweep, Sweep.id == ScheduleFiring.sweep_id)
        .where(ScheduleFiring.completed_at.is_(None), Sweep.state.in_(FINISHED))
        .order_by(ScheduleFiring.due_at)
        .with_for_update(of=ScheduleFiring, skip_locked=True)
    ).all()
    alerts = []
    for firing in finished:
        sweep = _sweep_of(session, firing.sweep_id)
        schedule = session.get_one(Schedule, firing.schedule_id)
        firing.completed_at = datetime.now(UTC)
        firing.context = sweep_context(session, sweep)
        completed = sweep.state == SweepState.completed
        firing.values = nightly_values(session, sweep) if completed else {}
        if not completed:
            notify(session, schedule, WebhookEvent.nightly_failed, failed_payload(schedule, firing))
        session.flush()
        for key in firing.values:
            variant, _, device_class = key.rpartition("@")
            alert = _detect(session, schedule, variant, device_class)
            if alert is not None:
                alerts.append(alert)
    return list(finished), alerts


def night_history(
    session: Session, schedule_id: int, variant: str, device_class: str
) -> list[ScheduleFiring]:
    """The nights the series judges: since the last confirmed change, less dismissed nights."""
    key = cell_key(variant, device_class)
    alerts = cell_alerts(session, schedule_id, variant, device_class)
    start = None
    dismissed = set()
    for alert in alerts:
        if alert.status == AlertStatus.confirmed:
            start = session.get_one(ScheduleFiring, alert.first_bad_firing_id).due_at
        elif alert.status == AlertStatus.dismissed:
            dismissed.add(alert.first_bad_firing_id)
    nights = session.scalars(
        select(ScheduleFiring)
        .where(ScheduleFiring.schedule_id == schedule_id, ScheduleFiring.completed_at.is_not(None))
        .order_by(ScheduleFiring.due_at)
    )
    return [
        night
        for night in nights
        if key in (night.values or {})
        and night.id not in dismissed
        and (start is None or night.due_at >= start)
    ]


def cell_alerts(session: Session, schedule_id: int, variant: str, device_class: str) -> list[Alert]:
    return list(
        session.scalars(
            select(Alert)
            .where(
                Alert.schedule_id == schedule_id,
                Alert.variant == variant,
                Alert.device_class == device_class,
            )
            .order_by(Alert.id)
        )
    )


def _detect(session: Session, schedule: Schedule, variant: str, device_class: str) -> Alert | None:
    alerts = cell_alerts(session, schedule.id, variant, device_class)
    if any(alert.status == AlertStatus.suspected for alert in alerts):
        return None  # its confirmation re-run decides first
    nights = night_history(session, schedule.id, variant, device_class)
    key = cell_key(variant, device_class)
    try:
        suspect = suspect_change(
            [(night.values or {})[key]["mean"] for night in nights],
            DetectionSettings(min_effect=schedule.min_effect),
        )
    except JudgingError:
        return None
    if suspect is None or suspect.index == 0:
        return None
    first_bad, last_good = nights[suspect.index], nights[suspect.index - 1]
    if any(alert.first_bad_firing_id == first_bad.id for alert in alerts):
        return None
    alert = Alert(
        schedule_id=schedule.id,
        variant=variant,
        device_class=device_class,
        direction=suspect.direction.value,
        status=AlertStatus.suspected,
        last_good_firing_id=last_good.id,
        first_bad_firing_id=first_bad.id,
        last_good_sweep_id=last_good.sweep_id,
        first_bad_sweep_id=first_bad.sweep_id,
        suspect=suspect.model_dump(mode="json"),
    )
    alert.confirmation_sweep_id = _rerun_same_builds(session, schedule, first_bad, device_class)
    session.add(alert)
    session.flush()
    return alert


def _rerun_same_builds(
    session: Session, schedule: Schedule, first_bad: ScheduleFiring, device_class: str
) -> int:
    """A confirmation sweep on the first bad night's builds: same spec, same toolchain, so the
    same build keys (content-addressed builds are shared, nothing is rebuilt)."""
    bad_sweep = _sweep_of(session, first_bad.sweep_id)
    spec = SweepSpec.model_validate(bad_sweep.spec).model_copy(update={"devices": [device_class]})
    toolchain = bad_sweep.variants[0].build.toolchain
    rerun = submit_sweep(
        session,
        spec,
        f"schedule {schedule.name} (confirmation re-run)",
        toolchain,
        priority=SweepPriority.nightly,
        project_id=schedule.project_id,
    )
    rerun = get_sweep(session, rerun.id)
    if [v.build_id for v in rerun.variants] != [v.build_id for v in bad_sweep.variants]:
        raise RuntimeError(f"confirmation re-run of sweep {bad_sweep.id} resolved other builds")
    return rerun.id


def decide_confirmations(session: Session) -> list[Alert]:
    """Suspected alerts whose re-run finished: confirmed (and announced) or dismissed."""
    pending = session.scalars(
        select(Alert)
        .join(Sweep, Sweep.id == Alert.confirmation_sweep_id)
        .where(Alert.status == AlertStatus.suspected, Sweep.state.in_(FINISHED))
        .with_for_update(of=Alert, skip_locked=True)
    ).all()
    for alert in pending:
        schedule = session.get_one(Schedule, alert.schedule_id)
        rerun = _sweep_of(session, alert.confirmation_sweep_id)
        value = nightly_values(session, rerun).get(cell_key(alert.variant, alert.device_class))
        suspect = SuspectedChange.model_validate(alert.suspect)
        alert.decided_at = datetime.now(UTC)
        if value is None:
            alert.status = AlertStatus.dismissed
            alert.confirmation = {"outcome": "dismissed", "reason": "the re-run measured nothing"}
            continue
        confirmation = confirm_change(
            suspect, [value["mean"]], DetectionSettings(min_effect=schedule.min_effect)
        )
        alert.confirmation = confirmation.model_dump(mode="json", exclude={"suspect"})
        if confirmation.outcome is Outcome.dismissed:
            alert.status = AlertStatus.dismissed
            continue
        _confirm(session, schedule, alert, confirmation)
    return list(pending)


def _confirm(
    session: Session, schedule: Schedule, alert: Alert, confirmation: Confirmation
) -> None:
    alert.status = AlertStatus.confirmed
    good = session.get_one(ScheduleFiring, alert.last_good_firing_id)
    bad = session.get_one(ScheduleFiring, alert.first_bad_firing_id)
    good_sweep, bad_sweep = _sweep_of(session, good.sweep_id), _sweep_of(session, bad.sweep_id)
    rows, note = verdicts_against_sweep(session, bad_sweep, good_sweep, schedule.min_effect)
    row = next(
        (r for r in rows if r.variant == alert.variant and r.device_class == alert.device_class),
        None,
    )
    alert.ratio = (
        row.decode_tok_s.model_dump(mode="json") if row else {"note": note or "not judged"}
    )
    alert.changed = what_changed(good.context or {}, bad.context or {})
    builds = [
        (before.build_id, after.build_id)
        for before, after in zip(good_sweep.variants, bad_sweep.variants, strict=False)
        if after.label == alert.variant
    ]
    if builds and builds[0][0] != builds[0][1]:
        alert.build_diff = f"/api/v1/builds/{builds[0][0]}/diff/{builds[0][1]}"
    event = WebhookEvent.regression if alert.direction == "regression" else WebhookEvent.improvement
    session.flush()
    notify(session, schedule, event, alert_payload(schedule, alert))


def _sweep_of(session: Session, sweep_id: int | None) -> Sweep:
    """The sweep a firing or an alert points at (set when it was started)."""
    if sweep_id is None:
        raise ValueError("a firing or alert without its sweep")
    return get_sweep(session, sweep_id)
