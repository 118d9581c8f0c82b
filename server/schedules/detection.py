"""From finished nightly sweeps to alerts: measure each night until it decides (adaptive
repetitions within the schedule's budget), record it, suspect a change, re-run the same builds
to confirm it before anyone is told (decodebench.judging.adaptive and .nightly do the
statistics; the device class's spread is learned from stored runs, server/schedules/spread.py).
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from decodebench.contracts.domain import SweepSpec
from decodebench.contracts.names import SweepPriority
from decodebench.contracts.schedules import AlertStatus, WebhookEvent
from decodebench.contracts.verdicts import JudgingError
from decodebench.judging.adaptive import AdaptiveSettings, NightCall, find_shift, night_call
from decodebench.judging.nightly import (
    Confirmation,
    DetectionSettings,
    Direction,
    Outcome,
    SuspectedChange,
    confirm_change,
    suspect_change,
)
from decodebench.stats import summarize
from server.models import Alert, DeviceSpread, Schedule, ScheduleFiring, Sweep, SweepState
from server.schedules.context import cell_key, nightly_values, sweep_context, what_changed
from server.schedules.spread import as_spread, learn_spread, stored_spread
from server.schedules.webhooks import alert_payload, failed_payload, notify
from server.sweeps.service import get_sweep, submit_sweep
from server.sweeps.verdicts import measured_arms, verdicts_against_sweep

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
    judged = []
    for firing in finished:
        sweep = _sweep_of(session, firing.sweep_id)
        schedule = session.get_one(Schedule, firing.schedule_id)
        completed = sweep.state == SweepState.completed
        if completed and not _measured(session, schedule, firing, sweep):
            continue  # its added runs are still measuring
        judged.append(firing)
        firing.completed_at = datetime.now(UTC)
        firing.context = sweep_context(session, sweep)
        firing.values = (
            _merged_values(session, _night_sweeps(session, sweep, firing)) if completed else {}
        )
        if not completed:
            notify(session, schedule, WebhookEvent.nightly_failed, failed_payload(schedule, firing))
        session.flush()
        for device_class in {key.rpartition("@")[2] for key in firing.values}:
            learn_spread(session, schedule.project_id, device_class)
        for key in firing.values:
            variant, _, device_class = key.rpartition("@")
            alert = _detect(session, schedule, variant, device_class)
            if alert is not None:
                alerts.append(alert)
    return judged, alerts


def settings_of(schedule: Schedule) -> AdaptiveSettings:
    spec = SweepSpec.model_validate(schedule.spec)
    return AdaptiveSettings(
        min_effect=schedule.min_effect,
        base_runs=spec.repetitions,
        budget=max(schedule.budget, spec.repetitions),
    )


def _night_sweeps(session: Session, sweep: Sweep, firing: ScheduleFiring) -> list[Sweep]:
    """The night's sweep and the top-up sweeps that added runs to it."""
    topups = sorted(
        {i for cell in (firing.adaptive or {}).values() for i in cell.get("topups", [])}
    )
    return [sweep, *(_sweep_of(session, sweep_id) for sweep_id in topups)]


def _cell_runs(session: Session, sweeps: list[Sweep]) -> dict[str, list[float]]:
    """Per series, each succeeded run's mean decode tok/s over its prompts, over the sweeps."""
    runs: dict[str, list[float]] = {}
    for sweep in sweeps:
        for arm in measured_arms(session, sweep):
            runs.setdefault(cell_key(arm.variant, arm.device_class), []).extend(
                sum(prompt.decode_tok_s for prompt in run.prompts) / len(run.prompts)
                for run in arm.runs
            )
    return runs


def _merged_values(session: Session, sweeps: list[Sweep]) -> dict[str, dict[str, float]]:
    """nightly_values over the night's sweep and its top-ups together."""
    if len(sweeps) == 1:
        return nightly_values(session, sweeps[0])
    rates: dict[str, list[float]] = {}
    for sweep in sweeps:
        for arm in measured_arms(session, sweep):
            rates.setdefault(cell_key(arm.variant, arm.device_class), []).extend(
                prompt.decode_tok_s for run in arm.runs for prompt in run.prompts
            )
    values = {}
    for key, cell in rates.items():
        summary = summarize(cell)
        values[key] = {"mean": summary.mean, "ci95_half_width": summary.ci95_half_width}
    return values


def night_runs(night: ScheduleFiring, key: str) -> list[float]:
    """A finished night's runs of a series (its mean alone for nights judged before runs were
    kept)."""
    cell = (night.adaptive or {}).get(key) or {}
    return list(cell.get("runs") or [(night.values or {})[key]["mean"]])


def _measured(session: Session, schedule: Schedule, firing: ScheduleFiring, sweep: Sweep) -> bool:
    """Whether the night has its runs: each series' interval decides at min_effect or the
    budget is spent. Otherwise a top-up sweep on the same builds adds a round (the variants
    interleaved as in any sweep) and the night waits for it."""
    adaptive = {key: dict(cell) for key, cell in (firing.adaptive or {}).items()}
    sweeps = _night_sweeps(session, sweep, firing)
    if any(other.state not in FINISHED for other in sweeps[1:]):
        return False
    settings = settings_of(schedule)
    asked: dict[str, int] = {}
    for key, runs in _cell_runs(session, sweeps).items():
        variant, _, device_class = key.rpartition("@")
        cell = adaptive.setdefault(key, {"topups": []})
        history = [
            night_runs(night, key)
            for night in night_history(session, schedule.id, variant, device_class)
        ]
        spread = stored_spread(session, schedule.project_id, device_class) or learn_spread(
            session, schedule.project_id, device_class
        )
        cell.update(runs=runs, runs_spent=len(runs))
        if spread is None or not history:
            cell.update(call=NightCall.decided.value, reason="no spread or level learned yet")
            continue
        judgement = night_call(history, runs, as_spread(spread), settings)
        cell.update(call=judgement.call.value, reason=judgement.reason)
        if judgement.call is NightCall.more:
            extra = min(settings.round_runs, settings.budget - len(runs))
            asked[device_class] = max(asked.get(device_class, 0), extra)
    for device_class, extra in sorted(asked.items()):
        topup = _rerun_same_builds(session, schedule, sweep, device_class, extra, "added runs")
        for key, cell in adaptive.items():
            if key.rpartition("@")[2] == device_class:
                cell["topups"] = [*cell.get("topups", []), topup]
    firing.adaptive = adaptive
    session.flush()
    return not asked


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
    spread = stored_spread(session, schedule.project_id, device_class)
    try:
        if spread is None:
            suspect = suspect_change(
                [(night.values or {})[key]["mean"] for night in nights],
                DetectionSettings(min_effect=schedule.min_effect),
            )
        else:
            suspect = _suspect_shift(
                [night_runs(night, key) for night in nights], spread, settings_of(schedule)
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


def _suspect_shift(
    nights: list[list[float]], spread: DeviceSpread, settings: AdaptiveSettings
) -> SuspectedChange | None:
    """The most significant shift anywhere in the series (since its last confirmed change),
    judged with the learned spread, as a suspected change."""
    shift = find_shift(nights, as_spread(spread), settings)
    if shift is None:
        return None
    means = [sum(runs) / len(runs) for runs in nights]
    before, after = means[: shift.index], means[shift.index :]
    direction = (
        Direction.improvement
        if (shift.relative_change > 0) == settings.higher_is_better
        else Direction.regression
    )
    return SuspectedChange(
        index=shift.index,
        direction=direction,
        relative_change=shift.relative_change,
        mean_before=sum(before) / len(before),
        mean_after=sum(after) / len(after),
        pvalue=shift.pvalue,
        before=tuple(before),
    )


def _rerun_same_builds(
    session: Session,
    schedule: Schedule,
    night: ScheduleFiring | Sweep,
    device_class: str,
    repetitions: int | None = None,
    purpose: str = "confirmation re-run",
) -> int:
    """A sweep on a night's builds: same spec, same toolchain, so the same build keys
    (content-addressed builds are shared, nothing is rebuilt); a confirmation re-run of the
    first bad night, or runs added to a night that cannot decide yet."""
    bad_sweep = night if isinstance(night, Sweep) else _sweep_of(session, night.sweep_id)
    update: dict[str, object] = {"devices": [device_class]}
    if repetitions is not None:
        update["repetitions"] = repetitions
    spec = SweepSpec.model_validate(bad_sweep.spec).model_copy(update=update)
    # Each build's own toolchain (a Core ML and a Core AI build name different packages).
    toolchain = {
        package: version
        for variant in bad_sweep.variants
        for package, version in variant.build.toolchain.items()
    }
    rerun = submit_sweep(
        session,
        spec,
        f"schedule {schedule.name} ({purpose})",
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
