"""Schedules and their firings: each due time of a schedule starts one sweep, exactly once.

Exactly once: a firing is a row unique per (schedule, due time), inserted with ON CONFLICT DO
NOTHING in the same transaction as its sweep. Two beats ticking at once both try the insert; the
second waits for the first's commit and inserts nothing, so it starts no sweep. A beat that was
down asks for the *latest* due time only, so a missed night runs once, not once per missed tick.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from croniter import croniter
from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from decodebench.contracts.domain import SweepSpec
from decodebench.contracts.names import SweepPriority
from decodebench.contracts.schedules import ScheduleCreate
from server import tenancy
from server.config import get_settings
from server.errors import Conflict, InvalidInput, NotFound
from server.models import Schedule, ScheduleFiring
from server.sweeps.service import submit_sweep

CLOCK_ENVIRONMENTS = ("test", "development")


def clock(now: datetime | None) -> datetime:
    """The tick's clock: the real one, or (test and development only) the one given."""
    if now is None:
        return datetime.now(UTC)
    if get_settings().environment not in CLOCK_ENVIRONMENTS:
        raise InvalidInput("now: a tick's clock is settable only in test or development")
    if now.tzinfo is None:
        raise InvalidInput("now: give a time zone (e.g. 2027-01-05T02:01:00Z)")
    return now


def create_schedule(session: Session, request: ScheduleCreate, owner: str) -> Schedule:
    project_id = tenancy.owner(session)
    named = select(Schedule.id).where(
        Schedule.name == request.name, Schedule.project_id == project_id
    )
    if session.scalar(named) is not None:
        raise Conflict(f"name: a schedule named {request.name!r} exists")
    if request.webhook_url and not request.webhook_secret:
        raise InvalidInput("webhook_secret: a webhook needs a secret to sign its deliveries")
    schedule = Schedule(
        name=request.name,
        spec=request.spec.model_dump(mode="json"),
        cron=request.cron,
        timezone=request.timezone,
        min_effect=request.min_effect,
        budget=request.budget,
        owner=owner,
        project_id=project_id,
        enabled=True,
        webhook_url=request.webhook_url,
        webhook_secret=request.webhook_secret,
    )
    session.add(schedule)
    session.flush()
    session.refresh(schedule)  # created_at from the database: firings are counted from it
    return schedule


def get_schedule(session: Session, schedule_id: int) -> Schedule:
    schedule = session.scalar(
        select(Schedule).where(Schedule.id == schedule_id, tenancy.schedules(session))
    )
    if schedule is None:
        raise NotFound(f"no schedule {schedule_id}")
    return schedule


def list_schedules(session: Session) -> list[Schedule]:
    return list(
        session.scalars(select(Schedule).where(tenancy.schedules(session)).order_by(Schedule.id))
    )


def set_enabled(session: Session, schedule_id: int, enabled: bool) -> Schedule:
    schedule = get_schedule(session, schedule_id)
    schedule.enabled = enabled
    return schedule


def latest_due(schedule: Schedule, now: datetime) -> datetime | None:
    """The newest due time at or before ``now`` since the schedule was created, or None."""
    local = now.astimezone(ZoneInfo(schedule.timezone)) + timedelta(seconds=1)
    due = croniter(schedule.cron, local).get_prev(datetime)
    return due if due >= schedule.created_at else None


def next_due(schedule: Schedule, now: datetime) -> datetime | None:
    if not schedule.enabled:
        return None
    local = max(now, schedule.created_at).astimezone(ZoneInfo(schedule.timezone))
    return croniter(schedule.cron, local).get_next(datetime)


def fire(
    session: Session, schedule: Schedule, due_at: datetime, trigger: str
) -> ScheduleFiring | None:
    """The firing and its sweep, or None when this due time has fired already."""
    firing_id = session.scalar(
        insert(ScheduleFiring)
        .values(schedule_id=schedule.id, due_at=due_at, trigger=trigger)
        .on_conflict_do_nothing(index_elements=["schedule_id", "due_at"])
        .returning(ScheduleFiring.id)
    )
    if firing_id is None:
        return None
    spec = SweepSpec.model_validate(schedule.spec)
    sweep = submit_sweep(
        session,
        spec,
        f"schedule {schedule.name}",
        get_settings().toolchain,
        priority=SweepPriority.nightly,
        project_id=schedule.project_id,
    )
    firing = session.get_one(ScheduleFiring, firing_id)
    firing.sweep_id = sweep.id
    return firing


def fire_due(session: Session, now: datetime) -> list[ScheduleFiring]:
    fired = []
    for schedule in session.scalars(select(Schedule).where(Schedule.enabled.is_(True))):
        due_at = latest_due(schedule, now)
        if due_at is not None and (firing := fire(session, schedule, due_at, "cron")):
            fired.append(firing)
    return fired


def run_now(session: Session, schedule_id: int, now: datetime) -> ScheduleFiring:
    schedule = get_schedule(session, schedule_id)
    firing = fire(session, schedule, now, "run-now")
    if firing is None:
        raise Conflict(f"schedule {schedule_id} already fired at {now.isoformat()}")
    return firing


def firings_of(session: Session, schedule_id: int) -> list[ScheduleFiring]:
    get_schedule(session, schedule_id)
    return list(
        session.scalars(
            select(ScheduleFiring)
            .where(ScheduleFiring.schedule_id == schedule_id)
            .order_by(ScheduleFiring.due_at)
        )
    )
