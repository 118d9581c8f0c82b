"""What a user can do to a sweep after submitting it (cancel it, retry a failed run), and the
runs no device can take: explained on the page, failed with that reason after a set wait."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from decodebench.contracts.names import DeviceStatus
from decodebench.contracts.profiles import DEVICE_PROFILES
from server import tenancy
from server.errors import Conflict, NotFound
from server.models import Build, BuildState, Device, Run, RunState, Sweep, SweepState
from server.runs.service import refresh_sweep_state
from server.transitions import move

UNSTARTED = (RunState.waiting_build.value, RunState.queued.value)


def _display_name(device_class: str) -> str:
    profile = DEVICE_PROFILES.get(device_class)
    return profile.display_name if profile else device_class


def _end_run(session: Session, run: Run, reason: str) -> None:
    run.failure_reason = reason
    run.finished_at = datetime.now(UTC)
    run.lease_expires_at = None
    move(session, "run", run, RunState.failed, reason)


def cancel_sweep(session: Session, sweep_id: int, user_name: str) -> Sweep:
    """Runs not started fail as cancelled; running ones finish (their results stay honest)."""
    sweep = session.scalar(
        select(Sweep).where(Sweep.id == sweep_id, tenancy.sweeps(session)).with_for_update()
    )
    if sweep is None:
        raise NotFound(f"sweep {sweep_id} does not exist")
    if sweep.state in (SweepState.completed, SweepState.failed):
        raise Conflict(f"sweep {sweep_id} has already ended ({sweep.state})")
    runs = session.scalars(
        select(Run).where(Run.sweep_id == sweep_id, Run.state.in_(UNSTARTED)).with_for_update()
    ).all()
    for run in runs:
        _end_run(session, run, f"cancelled by {user_name}")
    session.flush()
    refresh_sweep_state(session, sweep_id)
    return sweep


def retry_run(session: Session, sweep_id: int, run_id: int, user_name: str) -> Run:
    run = session.scalar(
        select(Run)
        .where(Run.id == run_id, Run.sweep_id == sweep_id, tenancy.runs(session))
        .with_for_update()
    )
    if run is None:
        raise NotFound(f"sweep {sweep_id} has no run {run_id}")
    if run.state != RunState.failed:
        raise Conflict(f"run {run_id} is {run.state}: only a failed run can be retried")
    build = session.get(Build, run.build_id)
    if build is None or build.state == BuildState.failed:
        raise Conflict(f"run {run_id} cannot be retried: its build failed")
    ready = build.state == BuildState.succeeded
    run.attempts = 0
    run.failure_reason = None
    run.finished_at = None
    run.device_udid = None
    target = RunState.queued if ready else RunState.waiting_build
    move(session, "run", run, target, f"retried by {user_name}")
    sweep = session.get(Sweep, sweep_id)
    if sweep is not None:
        sweep.finished_at = None
        sweep.verdict_cache = None  # its verdicts are judged again once the run has ended
    session.flush()
    refresh_sweep_state(session, sweep_id)
    return run


def is_ready(device: Device) -> bool:
    return device.connected and device.status == DeviceStatus.ready


def ready_devices_by_class(session: Session) -> dict[str, int]:
    counts: dict[str, int] = {}
    for device in session.scalars(select(Device).where(tenancy.devices(session))):
        if is_ready(device):
            counts[device.device_class] = counts.get(device.device_class, 0) + 1
    return counts


def unschedulable_reasons(
    session: Session, device_classes: set[str], project: int | None = None
) -> dict[str, str]:
    """Device class -> why no device can take its runs now; classes with a ready device are
    absent. Devices count as ready when connected with status ``ready``; those pinned to
    another project than the viewer's (or ``project``) do not count."""
    devices = session.scalars(
        select(Device).where(
            Device.device_class.in_(device_classes), tenancy.devices(session, project)
        )
    ).all()
    reasons = {}
    for device_class in sorted(device_classes):
        own = [device for device in devices if device.device_class == device_class]
        if any(is_ready(device) for device in own):
            continue
        name = _display_name(device_class)
        if not own:
            reasons[device_class] = f"no {name} attached; never seen by any agent"
            continue
        last = max(own, key=lambda device: device.last_seen_at)
        when = last.last_seen_at.strftime("%Y-%m-%d %H:%M:%S UTC")
        state = (
            DeviceStatus.disconnected.value
            if not last.connected
            else ": ".join(part for part in (last.status, last.status_detail) if part)
        )
        reasons[device_class] = f"no {name} attached and ready; last seen {when} ({state})"
    return reasons


def fail_unschedulable_runs(session: Session, wait_seconds: float) -> list[int]:
    """Queued runs older than ``wait_seconds`` whose device class has no ready device fail
    with the reason; called by the periodic reconcile. Returns the failed run ids."""
    cutoff = datetime.now(UTC) - timedelta(seconds=wait_seconds)
    stale = session.execute(
        select(Run, Sweep.project_id)
        .join(Sweep, Sweep.id == Run.sweep_id)
        .where(Run.state == RunState.queued.value, Run.created_at < cutoff)
        .with_for_update(of=Run, skip_locked=True)
    ).all()
    reasons = {
        project: unschedulable_reasons(
            session, {run.device_class for run, owner in stale if owner == project}, project
        )
        for project in {owner for _, owner in stale}
    }
    failed = []
    for run, project in stale:
        if run.device_class in reasons[project]:
            waited = int(wait_seconds // 60)
            _end_run(session, run, f"{reasons[project][run.device_class]} (waited {waited} min)")
            failed.append(run.id)
    session.flush()
    for sweep_id in sorted({run.sweep_id for run, _ in stale if run.id in failed}):
        refresh_sweep_state(session, sweep_id)
    return failed
