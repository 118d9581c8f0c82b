from __future__ import annotations

from fastapi import APIRouter
from pydantic import Field

from decodebench.analysis.diff import GraphDiff
from decodebench.contracts.api import BuildDetail, BuildStateView
from decodebench.contracts.base import Incoming
from decodebench.contracts.domain import VariantSpec
from decodebench.contracts.names import BuildState
from decodebench.contracts.workers import BuildAssignment, BuildOutcome
from server.artifacts.endpoints import get_store
from server.auth import AdminToken, SessionDep, UserToken, WorkerToken
from server.builds import service
from server.builds.diff import diff_builds
from server.builds.references import prompt_set_of
from server.builds.views import build_detail
from server.errors import AUTHENTICATED_ERRORS, InvalidInput
from server.lease_endpoints import add_lease_routes
from server.paths import RowId

router = APIRouter(prefix="/api/v1/builds", tags=["builds"], responses=AUTHENTICATED_ERRORS)
# start, lease, progress, fail and reconcile: as for every leased kind
add_lease_routes(router, service.BUILDS, "build_id")


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


@router.post("/{build_id}/complete", response_model=BuildStateView)
def complete(
    build_id: RowId, body: BuildOutcome, token: WorkerToken, session: SessionDep
) -> BuildStateView:
    if not get_store().exists(body.artifact_sha256):
        raise InvalidInput(f"artifact {body.artifact_sha256} has not been uploaded")
    return BuildStateView(state=BuildState(service.complete_build(session, build_id, body).state))


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
