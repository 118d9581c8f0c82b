"""Work a build worker holds under a lease: builds and doctor jobs, each described once by a
:class:`LeasedKind`.

A worker asks to start a piece of work; it proceeds, under a new lease, when the work is queued or
its last worker's lease has run out, so a killed worker's work is taken over without a human. A
duplicate delivery while another worker holds the lease, or finished work, is not redone. Progress
renews the lease; a report from anyone not holding it is refused (409), so work finishes once.
The reconciler queues again work whose worker stopped renewing, or fails it after its last
attempt, and sends again queued work no worker has started lately.

A kind's completion is its own (what a finished build or doctor job stores differs); everything
else here, and the routes of ``server/lease_endpoints.py``, is the same for every kind.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Generic, TypeVar

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from decodebench.contracts.base import Contract
from decodebench.contracts.leases import LeaseFailure, LeaseProgress
from server.config import Settings
from server.errors import Conflict
from server.models import Build, DoctorJob
from server.transitions import move

Leased = Build | DoctorJob
W = TypeVar("W", Build, DoctorJob)


@dataclass(frozen=True)
class LeasedKind(Generic[W]):
    """One kind of leased work: its table, its states, its settings and what it does on failing.

    ``get(session, id, lock)`` finds a row the caller may see (404 otherwise); ``fail`` fails
    it with a reason (a build fails its runs too); ``enqueue`` sends it to a worker after the
    commit; ``state_view`` is the contract ``fail`` answers with; ``after_reconcile`` runs last in
    the reconciler (builds: runs no device can take)."""

    entity: str  # the name transitions record it under
    noun: str  # what a message calls one ("doctor job 7")
    model: type[W]
    queued: StrEnum
    running: StrEnum
    finished: tuple[StrEnum, ...]
    attempts_setting: str  # the Settings field: attempts before it fails
    lease_setting: str  # the Settings field: seconds a lease lasts
    get: Callable[[Session, int, bool], W]
    fail: Callable[[Session, W, str], W]
    enqueue: Callable[[Session, int], None]
    state_view: type[Contract]
    on_start: Callable[[W], None] | None = None
    after_reconcile: Callable[[Session, Settings], None] | None = None

    def max_attempts(self, settings: Settings) -> int:
        return int(getattr(settings, self.attempts_setting))

    def lease_seconds(self, settings: Settings) -> float:
        return float(getattr(settings, self.lease_setting))


def lease_expired(work: Leased, now: datetime) -> bool:
    return work.lease_expires_at is None or work.lease_expires_at <= now


def take(
    session: Session,
    work: W,
    *,
    kind: LeasedKind[W],
    worker: str,
    lease_seconds: float,
) -> bool:
    """``worker`` starts ``work`` (locked) under a new lease, or is told not to (False)."""
    now = datetime.now(UTC)
    if work.state in kind.finished:
        return False
    if work.state == kind.running and not lease_expired(work, now):
        return False  # a duplicate delivery while another worker holds the lease
    reason = f"started by {worker}"
    if work.state == kind.running:
        reason = f"taken over by {worker}: {work.worker}'s lease ran out"
    work.attempts += 1
    work.worker = worker
    work.started_at = now
    work.updated_at = now
    work.stage = "starting"
    work.progress = 0.0
    work.lease_token = secrets.token_hex(16)
    work.lease_expires_at = now + timedelta(seconds=lease_seconds)
    move(session, kind.entity, work, kind.running, reason)
    if kind.on_start is not None:
        kind.on_start(work)
    return True


def start(
    session: Session, kind: LeasedKind[W], work_id: int, worker: str, lease_seconds: float
) -> tuple[bool, W]:
    """A worker asks to start: whether it proceeds, and the work (locked)."""
    work = kind.get(session, work_id, True)
    return take(session, work, kind=kind, worker=worker, lease_seconds=lease_seconds), work


def check_held(work: Leased, what: str, running: StrEnum, lease: str) -> None:
    """Refuse (409) a report about ``work`` from anyone not holding its lease."""
    if work.state != running or work.lease_token != lease:
        raise Conflict(
            f"{what} is not held under this lease (it is {work.state}"
            + (f", held by {work.worker})" if work.state == running else ")")
        )


def held(session: Session, kind: LeasedKind[W], work_id: int, lease: str) -> W:
    """The work, locked, if the caller holds its lease; a report from anyone else is refused."""
    work = kind.get(session, work_id, True)
    check_held(work, f"{kind.noun} {work_id}", kind.running, lease)
    return work


def renew(
    session: Session, kind: LeasedKind[W], work_id: int, lease: str, lease_seconds: float
) -> W:
    work = held(session, kind, work_id, lease)
    work.updated_at = datetime.now(UTC)
    work.lease_expires_at = work.updated_at + timedelta(seconds=lease_seconds)
    return work


def record_progress(
    session: Session,
    kind: LeasedKind[W],
    work_id: int,
    progress: LeaseProgress,
    lease_seconds: float,
) -> None:
    work = renew(session, kind, work_id, progress.lease, lease_seconds)
    length = getattr(kind.model.__table__.c.stage.type, "length", None)
    work.stage = progress.stage[:length] if length else progress.stage
    work.progress = progress.fraction


def release(work: Leased, now: datetime) -> None:
    """The work is no longer held by anyone (finished, failed or queued again)."""
    work.lease_token = None
    work.lease_expires_at = None
    work.updated_at = now


def fail(session: Session, kind: LeasedKind[W], work_id: int, failure: LeaseFailure) -> W:
    """The worker holding the work gives up on it, saying why."""
    return kind.fail(session, held(session, kind, work_id, failure.lease), failure.reason)


def expire(session: Session, kind: LeasedKind[W], max_attempts: int) -> list[int]:
    """Work whose worker stopped renewing its lease (killed, partitioned): queued again, or
    failed after its last attempt. Returns the ids queued again (to be sent to a worker)."""
    now = datetime.now(UTC)
    expired = session.scalars(
        select(kind.model)
        .where(kind.model.state == kind.running, kind.model.lease_expires_at < now)
        .with_for_update(skip_locked=True)
    ).all()
    requeued = []
    for work in expired:
        silent = f"{work.worker} stopped renewing its lease"
        if work.attempts >= max_attempts:
            kind.fail(session, work, f"{silent}; gave up after {work.attempts} attempts")
            continue
        release(work, now)
        work.stage = None
        work.progress = 0.0
        move(session, kind.entity, work, kind.queued, f"{silent}; queued again")
        requeued.append(work.id)
    return requeued


def stale(session: Session, kind: LeasedKind[W], older_than_seconds: float) -> list[int]:
    """Queued work no worker has started lately: its message may have been lost."""
    now = datetime.now(UTC)
    ids = list(
        session.scalars(
            select(kind.model.id).where(
                kind.model.state == kind.queued,
                kind.model.updated_at < now - timedelta(seconds=older_than_seconds),
            )
        )
    )
    if ids:
        session.execute(update(kind.model).where(kind.model.id.in_(ids)).values(updated_at=now))
    return ids


def reconcile(session: Session, kind: LeasedKind[W], settings: Settings) -> list[int]:
    """Queue again work whose lease ran out and send again queued work no worker started
    lately; the ids sent, in order."""
    expired = expire(session, kind, kind.max_attempts(settings))
    lost = stale(session, kind, older_than_seconds=settings.requeue_after_seconds)
    work_ids = sorted(set(expired) | set(lost))
    for work_id in work_ids:
        kind.enqueue(session, work_id)
    if kind.after_reconcile is not None:
        kind.after_reconcile(session, settings)
    return work_ids
