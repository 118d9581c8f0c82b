from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel, Field

from decodebench.contracts.api import BuildDetail, BuildStateView, Reenqueued
from decodebench.contracts.domain import VariantSpec
from decodebench.contracts.names import BuildState
from decodebench.contracts.protocol import (
    BuildAssignment,
    BuildFailure,
    BuildOutcome,
    BuildProgress,
    BuildStart,
)
from decodebench.diff import GraphDiff
from server.artifacts.endpoints import get_store
from server.auth import SessionDep, UserToken, WorkerToken
from server.builds import service
from server.builds.diff import diff_builds
from server.builds.views import build_detail
from server.errors import AUTHENTICATED_ERRORS, InvalidInput
from server.paths import RowId
from server.tasks import enqueue_build

router = APIRouter(prefix="/api/v1/builds", tags=["builds"], responses=AUTHENTICATED_ERRORS)


class WorkerIdentity(BaseModel):
    worker: str = Field(min_length=1, max_length=255)


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
    )


@router.post("/{build_id}/start", response_model=BuildStart)
def start(
    build_id: RowId, body: WorkerIdentity, token: WorkerToken, session: SessionDep
) -> BuildStart:
    proceed, build = service.start_build(session, build_id, body.worker)
    return BuildStart(proceed=proceed, state=build.state)


@router.post("/{build_id}/progress", status_code=204)
def progress(build_id: RowId, body: BuildProgress, token: WorkerToken, session: SessionDep) -> None:
    service.record_progress(session, build_id, body.stage, body.fraction)


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
    return BuildStateView(
        state=BuildState(service.fail_build(session, build_id, body.reason).state)
    )


@router.post("/reconcile", response_model=Reenqueued)
def reconcile(token: WorkerToken, session: SessionDep) -> Reenqueued:
    """Re-send builds the database says are pending but no worker has reported on lately."""
    build_ids = service.builds_to_reenqueue(session, older_than_seconds=120)
    for build_id in build_ids:
        enqueue_build(session, build_id)
    return Reenqueued(reenqueued=build_ids)
