"""Builds: one per distinct (model, variant, toolchain); their life cycle driven by workers."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from decodebench.contracts.api import BuildStateView
from decodebench.contracts.domain import VariantSpec
from decodebench.contracts.variants import build_key
from decodebench.contracts.workers import BuildOutcome
from decodebench.toolchain import format_toolchain
from server import leases, tenancy
from server.builds.references import check_references
from server.config import Settings
from server.errors import Conflict, InvalidInput, NotFound
from server.models import Build, BuildState, Run, RunState
from server.runs.service import refresh_sweeps_of_build
from server.tasks import enqueue_build
from server.transitions import move, record_created


def get_build(session: Session, build_id: int, *, lock: bool = False) -> Build:
    statement = select(Build).where(Build.id == build_id, tenancy.builds(session))
    if lock:
        statement = statement.with_for_update()
    build = session.scalar(statement)
    if build is None:
        raise NotFound(f"no build {build_id}")
    return build


def get_or_create_build(
    session: Session,
    model: str,
    variant: VariantSpec,
    toolchain: dict[str, str],
    identity: str | None = None,
    references: dict[str, object] | None = None,
) -> Build:
    """Content addressing: an identical variant is built once and shared by every sweep (for a
    model with a tokenizer, by every sweep of the same prompts: ``references``). ``identity``
    (default: ``model``) is what the key hashes: an uploaded model's content too. ``toolchain``
    may name every format's packages: the build is keyed by its variant's format's part."""
    toolchain = format_toolchain(toolchain, variant.format)
    key = build_key(identity or model, variant, toolchain, references)
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
    # Not through get_build: the new build is not yet referenced by the submitter's sweep.
    build = session.get(Build, inserted_id, with_for_update=True) if inserted_id else None
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


def complete_build(session: Session, build_id: int, outcome: BuildOutcome) -> Build:
    build = get_build(session, build_id, lock=True)
    if build.state == BuildState.succeeded and build.artifact_sha256 == outcome.artifact_sha256:
        return build  # the same completion again: its response was lost on the wire
    build = leases.held(session, BUILDS, build_id, outcome.lease)
    if outcome.report.key != build.key:
        raise InvalidInput(f"report key {outcome.report.key} is not build {build.key}")
    check_references(session, build, outcome.report)
    build.artifact_sha256 = outcome.artifact_sha256
    build.report = outcome.report.model_dump(mode="json")
    build.stage = "done"
    build.progress = 1.0
    build.finished_at = datetime.now(UTC)
    leases.release(build, build.finished_at)
    move(session, "build", build, BuildState.succeeded, "artifact uploaded and analysed")
    waiting = session.scalars(
        select(Run).where(Run.build_id == build_id, Run.state == RunState.waiting_build)
    ).all()
    for run in waiting:
        move(session, "run", run, RunState.queued, f"build {build_id} succeeded")
    refresh_sweeps_of_build(session, build_id)
    return build


def _fail(session: Session, build: Build, reason: str) -> Build:
    """Fail the build and every run that was to measure it (a failed build measures nothing)."""
    build.error = reason
    build.finished_at = datetime.now(UTC)
    leases.release(build, build.finished_at)
    move(session, "build", build, BuildState.failed, reason)
    unfinished = session.scalars(
        select(Run)
        .where(
            Run.build_id == build.id,
            Run.state.in_([RunState.waiting_build, RunState.queued, RunState.running]),
        )
        .with_for_update()
    ).all()
    for run in unfinished:
        run.failure_reason = f"build {build.id} failed: {reason}"
        run.finished_at = build.finished_at
        run.lease_expires_at = None
        move(session, "run", run, RunState.failed, run.failure_reason)
    refresh_sweeps_of_build(session, build.id)
    return build


def abandon_build(session: Session, build_id: int, reason: str, by: str) -> Build:
    """An operator fails a build in any state, a succeeded one included (a bad artifact)."""
    build = get_build(session, build_id, lock=True)
    if build.state == BuildState.failed:
        raise Conflict(f"build {build_id} has already failed")
    return _fail(session, build, f"failed by {by}: {reason}")


def rebuild(session: Session, build_id: int, reason: str, by: str) -> Build:
    """An operator has a build made again: its artifact is dropped, its runs wait for the new one."""
    build = get_build(session, build_id, lock=True)
    if build.state == BuildState.queued:
        raise Conflict(f"build {build_id} is already queued")
    build.report = None
    build.artifact_sha256 = None
    build.error = None
    build.stage = None
    build.progress = 0.0
    build.attempts = 0
    build.lease_token = None
    build.lease_expires_at = None
    build.updated_at = datetime.now(UTC)
    move(session, "build", build, BuildState.queued, f"rebuild requested by {by}: {reason}")
    runs = session.scalars(
        select(Run).where(Run.build_id == build.id, Run.state == RunState.queued).with_for_update()
    ).all()
    for run in runs:
        move(session, "run", run, RunState.waiting_build, f"build {build.id} is being rebuilt")
    enqueue_build(session, build.id)
    refresh_sweeps_of_build(session, build.id)
    return build


def _get_locked(session: Session, build_id: int, lock: bool) -> Build:
    return get_build(session, build_id, lock=lock)


# What else the periodic reconcile does, added by the domains above builds (the application
# wires in the sweeps' failing of queued runs no ready device can take), so builds imports none.
RECONCILE_STEPS: list[Callable[[Session, Settings], object]] = []


def _after_reconcile(session: Session, settings: Settings) -> None:
    for step in RECONCILE_STEPS:
        step(session, settings)


# Builds as leased work (server/leases.py): a worker starts, renews, reports and fails them
# through the routes every leased kind has.
BUILDS = leases.LeasedKind(
    entity="build",
    noun="build",
    model=Build,
    queued=BuildState.queued,
    running=BuildState.building,
    finished=(BuildState.succeeded, BuildState.failed),
    attempts_setting="max_build_attempts",
    lease_setting="build_lease_seconds",
    get=_get_locked,
    fail=_fail,
    enqueue=enqueue_build,
    state_view=BuildStateView,
    after_reconcile=_after_reconcile,
)
