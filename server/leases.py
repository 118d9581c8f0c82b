"""Work a build worker holds under a lease: builds and doctor jobs.

A worker asks to start a piece of work; it proceeds, under a new lease, when the work is queued or
its last worker's lease has run out, so a killed worker's work is taken over without a human. A
duplicate delivery while another worker holds the lease, or finished work, is not redone. Progress
renews the lease; a report from anyone not holding it is refused (409), so work finishes once.
"""

from __future__ import annotations

import secrets
from datetime import UTC, datetime, timedelta
from enum import StrEnum

from sqlalchemy.orm import Session

from server.errors import Conflict
from server.models import Build, DoctorJob
from server.transitions import move

Leased = Build | DoctorJob


def lease_expired(work: Leased, now: datetime) -> bool:
    return work.lease_expires_at is None or work.lease_expires_at <= now


def take(
    session: Session,
    entity: str,
    work: Leased,
    worker: str,
    lease_seconds: float,
    running: StrEnum,
    finished: tuple[StrEnum, ...],
) -> bool:
    """``worker`` starts ``work`` (locked) under a new lease, or is told not to (False)."""
    now = datetime.now(UTC)
    if work.state in finished:
        return False
    if work.state == running and not lease_expired(work, now):
        return False  # a duplicate delivery while another worker holds the lease
    reason = f"started by {worker}"
    if work.state == running:
        reason = f"taken over by {worker}: {work.worker}'s lease ran out"
    work.attempts += 1
    work.worker = worker
    work.started_at = now
    work.updated_at = now
    work.stage = "starting"
    work.progress = 0.0
    work.lease_token = secrets.token_hex(16)
    work.lease_expires_at = now + timedelta(seconds=lease_seconds)
    move(session, entity, work, running, reason)
    return True


def check_held(work: Leased, what: str, running: StrEnum, lease: str) -> None:
    """Refuse (409) a report about ``work`` from anyone not holding its lease."""
    if work.state != running or work.lease_token != lease:
        raise Conflict(
            f"{what} is not held under this lease (it is {work.state}"
            + (f", held by {work.worker})" if work.state == running else ")")
        )


def renew(work: Leased, lease_seconds: float) -> None:
    work.updated_at = datetime.now(UTC)
    work.lease_expires_at = work.updated_at + timedelta(seconds=lease_seconds)
