"""Runs: claimed by agents under a lease, results uploaded idempotently per prompt."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from sqlalchemy import bindparam, exists, select
from sqlalchemy.orm import Session

from server.db import follow_up_after_commit
from server.errors import Conflict, NotFound
from server.models import (
    TERMINAL_RUN_STATES,
    Build,
    BuildState,
    Device,
    Run,
    RunState,
    Sweep,
    SweepState,
)
from server.runs.queue import BatchShares
from server.transitions import move


def get_run(session: Session, run_id: int, *, lock: bool = False) -> Run:
    statement = select(Run).where(Run.id == run_id)
    if lock:
        statement = statement.with_for_update()
    run = session.scalar(statement)
    if run is None:
        raise NotFound(f"no run {run_id}")
    return run


def _sweep_target(session: Session, sweep_id: int) -> tuple[SweepState, str, bool]:
    states = session.execute(
        select(Run.state, Build.state)
        .join(Build, Build.id == Run.build_id)
        .where(Run.sweep_id == sweep_id)
    ).all()
    return _target_of([(run_state, build_state) for run_state, build_state in states])


def _target_of(states: Sequence[tuple[str, str]]) -> tuple[SweepState, str, bool]:
    run_states = [run_state for run_state, _ in states]
    if all(state in TERMINAL_RUN_STATES for state in run_states):
        failed = run_states.count(RunState.failed)
        if failed:
            return SweepState.failed, f"{failed} of {len(run_states)} runs failed", True
        return SweepState.completed, "all runs succeeded", True
    if any(build_state != BuildState.succeeded for _, build_state in states):
        return SweepState.building, "waiting for builds", False
    return SweepState.running, "all builds ready; runs in progress", False


def refresh_sweep_state(session: Session, sweep_id: int) -> None:
    sweep = session.scalar(select(Sweep).where(Sweep.id == sweep_id).with_for_update())
    if sweep is None:
        return
    target, reason, ended = _sweep_target(session, sweep_id)
    if ended and sweep.finished_at is None:
        sweep.finished_at = datetime.now(UTC)
    move(session, "sweep", sweep, target, reason)


# One round trip: the sweeps' states, and whether any of each one's runs has yet to end.
_SWEEP_STATES_AND_RUN_LEFT = (
    select(
        Sweep.id,
        Sweep.state,
        exists()
        .where(Run.sweep_id == Sweep.id, Run.state.not_in(list(TERMINAL_RUN_STATES)))
        .label("run_left"),
    )
    .where(Sweep.id.in_(bindparam("sweep_ids", expanding=True)))
    .order_by(Sweep.id)
)
_SETTLING_KEY = "sweeps to settle"


def settle_sweep_after_commit(session: Session, sweep_id: int) -> None:
    """Bring the sweep's state up to date once this transaction is committed.

    Every claim and upload used to lock the sweep row, so all devices of a sweep queued on it.
    Checked after the commit, the last of two concurrently finishing runs always sees both
    (its check starts after its own commit, which follows or precedes the other's check), so
    the lock is taken only when the state actually changes. The sweeps of a transaction (a
    batch of uploads) are checked together, in one statement."""
    sweeps: set[int] = set()
    if follow_up_after_commit(
        session, lambda follow_up: _settle_sweeps(follow_up, sweeps), once=_SETTLING_KEY
    ):
        session.info[_SETTLING_KEY] = sweeps  # this transaction's; a rollback starts anew
    session.info[_SETTLING_KEY].add(sweep_id)


def _settle_sweeps(follow_up: Session, sweeps: set[int]) -> None:
    sweep_ids = sorted(sweeps)
    found = follow_up.execute(_SWEEP_STATES_AND_RUN_LEFT, {"sweep_ids": sweep_ids}).all()
    for sweep_id, state, run_left in found:
        if state == SweepState.running and run_left:
            continue  # a run is left, so it stays running: no need to read all of its runs
        if _sweep_target(follow_up, sweep_id)[0] != state:
            refresh_sweep_state(follow_up, sweep_id)
            follow_up.commit()  # one sweep's row lock at a time


def refresh_sweeps_of_build(session: Session, build_id: int) -> None:
    sweep_ids = session.scalars(
        select(Run.sweep_id).where(Run.build_id == build_id).distinct()
    ).all()
    for sweep_id in sorted(sweep_ids):
        refresh_sweep_state(session, sweep_id)


def expire_leases(session: Session, max_attempts: int) -> int:
    """Runs whose agent stopped renewing go back to the queue, or fail after too many tries."""
    now = datetime.now(UTC)
    expired = session.scalars(
        select(Run)
        .where(Run.state == RunState.running, Run.lease_expires_at < now)
        .with_for_update(skip_locked=True)
    ).all()
    for run in expired:
        _requeue_or_fail(session, run, f"lease expired on device {run.device_udid}", max_attempts)
    return len(expired)


def _requeue_or_fail(session: Session, run: Run, reason: str, max_attempts: int) -> None:
    run.failure_reason = reason
    run.lease_expires_at = None
    if run.attempts >= max_attempts:
        run.finished_at = datetime.now(UTC)
        if max_attempts > 0:
            run.failure_reason = f"{reason} (gave up after {run.attempts} attempts)"
        move(session, "run", run, RunState.failed, run.failure_reason)
        refresh_sweep_state(session, run.sweep_id)
    else:
        move(session, "run", run, RunState.queued, f"{reason}; retrying")


def claim_run(
    session: Session,
    agent_id: int,
    device_udid: str,
    lease_seconds: int,
    *,
    claim_key: str | None = None,
    max_attempts: int = 3,
    aging_s: float = 300.0,
) -> tuple[Run | None, str]:
    """The device's next run under a lease, or None; and the device's class (what an idle
    device's long poll waits on): a batch of one (`claim_runs`), except that a claim without a
    key is allowed (and refused while the device holds a run). Touches only the device's row
    (locked, so one device's claims run one after the other: a retry waits for the claim it
    repeats) and the runs it reads or takes (SKIP LOCKED): no row every device waits on."""
    given, waiting = claim_runs(
        session,
        agent_id,
        [(device_udid, claim_key)],
        lease_seconds,
        max_attempts=max_attempts,
        aging_s=aging_s,
    )
    run = given.get(device_udid)
    if run is None:
        (device_class,) = waiting  # a device left without a run: its class waits
        return None, device_class
    return run, run.device_class


def claim_runs(
    session: Session,
    agent_id: int,
    claims: Sequence[tuple[str, str | None]],
    lease_seconds: int,
    *,
    max_attempts: int = 3,
    aging_s: float = 300.0,
) -> tuple[dict[str, Run], set[str]]:
    """`claim_run` for several devices of one agent at once, ``claims`` being (device, claim
    key) pairs: the runs given, by device, and the classes of the devices left without one.

    The same rules per device, in fewer statements: the devices' rows are locked in one
    statement (in id order, as a heartbeat locks them, so it deadlocks with neither another
    batch nor a heartbeat), their held runs read in one, and each class's fair-share ranking is
    read once for all of its devices."""
    udids = sorted(udid for udid, _ in claims)
    keys = dict(claims)
    devices = {
        device.udid: device
        for device in session.scalars(
            select(Device).where(Device.udid.in_(udids)).order_by(Device.id).with_for_update()
        )
    }
    for udid in udids:
        device = devices.get(udid)
        if device is None or device.agent_id != agent_id:
            raise NotFound(f"device {udid} is not registered to this agent")
    now = datetime.now(UTC)
    held_by: dict[str, list[Run]] = {}
    for run in session.scalars(
        select(Run)
        .where(Run.device_udid.in_(udids), Run.state == RunState.running)
        .order_by(Run.id)
        .with_for_update()
    ):
        held_by.setdefault(run.device_udid or "", []).append(run)
    given: dict[str, Run] = {}
    wanting: dict[tuple[str, int | None], list[str]] = {}
    for udid in udids:
        device = devices[udid]
        held = held_by.get(udid, [])
        again = _held_or_given_up(
            session, device, held, agent_id, keys[udid], lease_seconds, now, max_attempts
        )
        if again is not None:
            given[udid] = again
        else:
            wanting.setdefault((device.device_class, device.project_id), []).append(udid)
    waiting: set[str] = set()
    for (device_class, project_id), group in wanting.items():
        shares = BatchShares(session, device_class, aging_s, project_id, len(group))
        for udid in group:
            taken = shares.take(udid, now)
            if taken is None:
                waiting.add(device_class)
                break  # this class has nothing more for this batch
            _lease(session, taken, agent_id, udid, keys[udid], lease_seconds, now)
            given[udid] = taken
    return given, waiting


def _held_or_given_up(
    session: Session,
    device: Device,
    held: Sequence[Run],
    agent_id: int,
    claim_key: str | None,
    lease_seconds: int,
    now: datetime,
    max_attempts: int,
) -> Run | None:
    """The run a repeated claim (same key) gets back, its lease renewed; else None, the device's
    other held runs given up (queued again). Without a key a held run is a conflict."""
    for run in held:
        if claim_key is not None and run.claim_key == claim_key and run.agent_id == agent_id:
            # The same claim again (its answer was lost): the same run, its lease renewed.
            run.lease_expires_at = now + timedelta(seconds=lease_seconds)
            return run
    if held and claim_key is None:
        raise Conflict(f"device {device.udid} already has a run in progress")
    for run in held:
        # A new claim key means the agent no longer holds this run (it restarted, or gave the
        # run up): queue it again now rather than when its lease runs out.
        _requeue_or_fail(
            session,
            run,
            f"device {device.udid} claimed anew; its agent gave the run up",
            max_attempts,
        )
    return None


def _lease(
    session: Session,
    run: Run,
    agent_id: int,
    device_udid: str,
    claim_key: str | None,
    lease_seconds: int,
    now: datetime,
) -> None:
    run.attempts += 1
    run.agent_id = agent_id
    run.device_udid = device_udid
    run.claim_key = claim_key
    run.started_at = now
    run.lease_expires_at = now + timedelta(seconds=lease_seconds)
    # A claim changes no sweep's state: its run was queued, so its build had succeeded and the
    # sweep was already running (or building for its other builds), and it stays so.
    move(session, "run", run, RunState.running, f"claimed for {device_udid}")


def _owned_running_run(session: Session, run_id: int, agent_id: int) -> Run:
    run = get_run(session, run_id, lock=True)
    if run.agent_id != agent_id:
        raise Conflict(f"run {run_id} is not leased to this agent")
    if run.state != RunState.running:
        raise Conflict(f"run {run_id} is {run.state}, not running")
    return run


def renew_lease(session: Session, run_id: int, agent_id: int, lease_seconds: int) -> Run:
    run = _owned_running_run(session, run_id, agent_id)
    run.lease_expires_at = datetime.now(UTC) + timedelta(seconds=lease_seconds)
    return run


def fail_run(
    session: Session, run_id: int, agent_id: int, reason: str, retryable: bool, max_attempts: int
) -> Run:
    run = _owned_running_run(session, run_id, agent_id)
    _requeue_or_fail(session, run, reason, max_attempts if retryable else 0)
    return run


def fail_unassignable(session: Session, run: Run, reason: str) -> None:
    """A claimed run that cannot be handed out (its stored rows do not read) fails for good."""
    _requeue_or_fail(session, run, reason, 0)
