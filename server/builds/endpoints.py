from __future__ import annotations

from collections.abc import Callable

from fastapi import APIRouter
from pydantic import Field
from sqlalchemy.orm import Session

from decodebench.analysis.diff import GraphDiff
from decodebench.contracts.api import BuildDetail, BuildStateView, Reenqueued
from decodebench.contracts.base import Incoming
from decodebench.contracts.domain import VariantSpec
from decodebench.contracts.names import BuildState
from decodebench.contracts.workers import (
    BuildAssignment,
    BuildFailure,
    BuildLease,
    BuildOutcome,
    BuildProgress,
    BuildStart,
    WorkerIdentity,
)
from server.artifacts.endpoints import get_store
from server.auth import AdminToken, SessionDep, UserToken, WorkerToken
from server.builds import service
from server.builds.diff import diff_builds
from server.builds.references import prompt_set_of
from server.builds.views import build_detail
from server.config import get_settings
from server.errors import AUTHENTICATED_ERRORS, InvalidInput
from server.paths import RowId
from server.tasks import enqueue_build

router = APIRouter(prefix="/api/v1/builds", tags=["builds"], responses=AUTHENTICATED_ERRORS)

# What else the periodic reconcile does, added by the domains above builds (the application
# wires in the sweeps' failing of queued runs no ready device can take), so builds imports none.
RECONCILE_STEPS: list[Callable[[Session], object]] = []


class OperatorAction(Incoming):
    reason: str = Field(min_length=1, max_length=2000, description="Recorded with the change")


@router.get("/{build_id}", response_model=BuildDetail)
def get_build(build_id: RowId, token: UserToken, session: SessionDep) -> BuildDetail:
    return build_detail(service.get_build(session, build_id))


@router.get("/{build_id}/diff/{other_id}", response_model=GraphDiff)
def diff(build_id: RowId, other_id: RowId, token: UserToken, session: SessionDep) -> GraphDiff:
    """What changes from build ``build_id`` (A) to ``other_id`` (B): ops, bytes moved per token
    by category, redundant copies only one of them makes, and the predicted speed-up of B."""
    return diff_builds(session, build_id, other_id)


@router.get("/{build_id}/assignment", response_model=BuildAssignment)
def assignment(build_id: RowId, token: WorkerToken, session: SessionDep) -> BuildAssignment:
    build = service.get_build(session, build_id)
    return BuildAssignment(
        build_id=build.id,
        key=build.key,
        model=build.model,
        variant=VariantSpec.model_validate(build.variant),
        state=build.state,
        toolchain=build.toolchain,
        prompt_set=prompt_set_of(session, build),
    )


@router.post("/{build_id}/start", response_model=BuildStart)
def start(
    build_id: RowId, body: WorkerIdentity, token: WorkerToken, session: SessionDep
) -> BuildStart:
    lease_seconds = get_settings().build_lease_seconds
    proceed, build = service.start_build(session, build_id, body.worker, lease_seconds)
    if not proceed:
        return BuildStart(proceed=False, state=build.state)
    return BuildStart(
        proceed=True, state=build.state, lease=build.lease_token, lease_seconds=lease_seconds
    )


@router.post("/{build_id}/lease", status_code=204)
def renew(build_id: RowId, body: BuildLease, token: WorkerToken, session: SessionDep) -> None:
    """The worker building it is alive: its lease runs on."""
    service.renew_build_lease(session, build_id, body.lease, get_settings().build_lease_seconds)


@router.post("/{build_id}/progress", status_code=204)
def progress(build_id: RowId, body: BuildProgress, token: WorkerToken, session: SessionDep) -> None:
    service.record_progress(session, build_id, body, get_settings().build_lease_seconds)


@router.post("/{build_id}/complete", response_model=BuildStateView)
def complete(
    build_id: RowId, body: BuildOutcome, token: WorkerToken, session: SessionDep
) -> BuildStateView:
    if not get_store().exists(body.artifact_sha256):
        raise InvalidInput(f"artifact {body.artifact_sha256} has not been uploaded")
    return BuildStateView(state=BuildState(service.complete_build(session, build_id, body).state))


@router.post("/{build_id}/fail", response_model=BuildStateView)
def fail(
    build_id: RowId, body: BuildFailure, token: WorkerToken, session: SessionDep
) -> BuildStateView:
    return BuildStateView(state=BuildState(service.fail_build(session, build_id, body).state))


@router.post("/reconcile", response_model=Reenqueued)
def reconcile(token: WorkerToken, session: SessionDep) -> Reenqueued:
    """Queue again builds whose worker's lease ran out, and re-send queued builds no worker has
    started lately (their message may have been lost)."""
    settings = get_settings()
    expired = service.expire_build_leases(session, settings.max_build_attempts)
    stale = service.builds_to_reenqueue(session, older_than_seconds=settings.requeue_after_seconds)
    build_ids = sorted(set(expired) | set(stale))
    for build_id in build_ids:
        enqueue_build(session, build_id)
    for step in RECONCILE_STEPS:
        step(session)
    return Reenqueued(reenqueued=build_ids)


@router.post("/{build_id}/abandon", response_model=BuildStateView)
def abandon(
    build_id: RowId, body: OperatorAction, token: AdminToken, session: SessionDep
) -> BuildStateView:
    """Fail a build in any state, a succeeded one too (a bad artifact): its unfinished runs fail."""
    build = service.abandon_build(session, build_id, body.reason, token.name)
    return BuildStateView(state=BuildState(build.state))


@router.post("/{build_id}/rebuild", response_model=BuildStateView)
def rebuild(
    build_id: RowId, body: OperatorAction, token: AdminToken, session: SessionDep
) -> BuildStateView:
    """Build it again: the artifact and report are dropped, its queued runs wait for the new one."""
    build = service.rebuild(session, build_id, body.reason, token.name)
    return BuildStateView(state=BuildState(build.state))
