"""Builds: one per distinct (model, variant, toolchain); their life cycle driven by workers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from decodebench.contracts.domain import VariantSpec, build_key
from decodebench.contracts.protocol import BuildOutcome
from server.errors import Conflict, InvalidInput, NotFound
from server.models import Build, BuildState, Run, RunState
from server.runs.service import refresh_sweeps_of_build
from server.tasks import enqueue_build
from server.transitions import move, record_created

# A building build whose worker has reported nothing for this long is presumed lost.
BUILDER_SILENCE_SECONDS = 600.0


def get_build(session: Session, build_id: int, *, lock: bool = False) -> Build:
    statement = select(Build).where(Build.id == build_id)
    if lock:
        statement = statement.with_for_update()
    build = session.scalar(statement)
    if build is None:
        raise NotFound(f"no build {build_id}")
    return build


def get_or_create_build(
    session: Session, model: str, variant: VariantSpec, toolchain: dict[str, str]
) -> Build:
    """Content addressing: an identical variant is built once and shared by every sweep."""
    key = build_key(model, variant, toolchain)
    inserted_id = session.scalar(
        insert(Build)
        .values(
            key=key,
            model=model,
            variant=variant.graph_identity(),
            toolchain=toolchain,
            state=BuildState.queued,
            progress=0.0,
            attempts=0,
        )
        .on_conflict_do_nothing(index_elements=[Build.key])
        .returning(Build.id)
    )
    build = get_build(session, inserted_id, lock=True) if inserted_id else None
    if build is not None:
        record_created(session, "build", build.id, BuildState.queued, "requested")
        enqueue_build(session, build.id)
        return build
    build = session.scalar(select(Build).where(Build.key == key).with_for_update())
    assert build is not None
    if build.state == BuildState.failed:
        move(session, "build", build, BuildState.queued, "requested again after a failure")
        build.error = None
        build.stage = None
        build.progress = 0.0
        enqueue_build(session, build.id)
    return build


def start_build(session: Session, build_id: int, worker: str) -> tuple[bool, Build]:
    """A worker asks to build; only one may proceed, and a finished build is never redone."""
    build = get_build(session, build_id, lock=True)
    if build.state in (BuildState.succeeded, BuildState.failed):
        return False, build
    if build.state == BuildState.building and build.updated_at > _seconds_before(
        datetime.now(UTC), BUILDER_SILENCE_SECONDS
    ):
        return False, build  # a duplicate delivery while another worker is still reporting
    build.attempts += 1
    build.worker = worker
    build.started_at = datetime.now(UTC)
    build.updated_at = build.started_at
    build.stage = "starting"
    build.progress = 0.0
    move(session, "build", build, BuildState.building, f"started by {worker}")
    return True, build


def record_progress(session: Session, build_id: int, stage: str, fraction: float) -> None:
    build = get_build(session, build_id, lock=True)
    if build.state != BuildState.building:
        raise Conflict(f"build {build_id} is {build.state}, not building")
    build.stage = stage
    build.progress = fraction
    build.updated_at = datetime.now(UTC)


def complete_build(session: Session, build_id: int, outcome: BuildOutcome) -> Build:
    build = get_build(session, build_id, lock=True)
    if build.state == BuildState.succeeded:
        if build.artifact_sha256 != outcome.artifact_sha256:
            raise Conflict(f"build {build_id} already succeeded with another artifact")
        return build
    if build.state != BuildState.building:
        raise Conflict(f"build {build_id} is {build.state}, not building")
    if outcome.report.key != build.key:
        raise InvalidInput(f"report key {outcome.report.key} is not build {build.key}")
    build.artifact_sha256 = outcome.artifact_sha256
    build.report = outcome.report.model_dump(mode="json")
    build.stage = "done"
    build.progress = 1.0
    build.finished_at = datetime.now(UTC)
    build.updated_at = build.finished_at
    move(session, "build", build, BuildState.succeeded, "artifact uploaded and analysed")
    waiting = session.scalars(
        select(Run).where(Run.build_id == build_id, Run.state == RunState.waiting_build)
    ).all()
    for run in waiting:
        move(session, "run", run, RunState.queued, f"build {build_id} succeeded")
    refresh_sweeps_of_build(session, build_id)
    return build


def fail_build(session: Session, build_id: int, reason: str) -> Build:
    build = get_build(session, build_id, lock=True)
    if build.state == BuildState.succeeded:
        raise Conflict(f"build {build_id} already succeeded")
    build.error = reason
    build.finished_at = datetime.now(UTC)
    build.updated_at = build.finished_at
    move(session, "build", build, BuildState.failed, reason)
    waiting = session.scalars(
        select(Run).where(Run.build_id == build_id, Run.state == RunState.waiting_build)
    ).all()
    for run in waiting:
        run.failure_reason = f"build {build_id} failed: {reason}"
        run.finished_at = build.finished_at
        move(session, "run", run, RunState.failed, run.failure_reason)
    refresh_sweeps_of_build(session, build_id)
    return build


def builds_to_reenqueue(session: Session, older_than_seconds: float) -> list[int]:
    """Queued builds whose message may have been lost, and building ones whose worker went quiet."""
    now = datetime.now(UTC)
    stale = session.scalars(
        select(Build.id).where(
            (
                (Build.state == BuildState.queued)
                & (Build.updated_at < _seconds_before(now, older_than_seconds))
            )
            | (
                (Build.state == BuildState.building)
                & (Build.updated_at < _seconds_before(now, BUILDER_SILENCE_SECONDS))
            ),
        )
    ).all()
    if stale:
        session.execute(update(Build).where(Build.id.in_(stale)).values(updated_at=now))
    return list(stale)


def _seconds_before(moment: datetime, seconds: float) -> datetime:
    return moment - timedelta(seconds=seconds)
