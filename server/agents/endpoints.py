from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from decodebench.contracts.api import DeviceView, ResultsStored, RunStateView
from decodebench.contracts.names import RunState
from decodebench.contracts.protocol import (
    AgentRegistered,
    AgentRegistration,
    ClaimRequest,
    ClaimResponse,
    ClaimsRequest,
    ClaimsResponse,
    DeviceRun,
    Heartbeat,
    LeaseRenewal,
    ResultsBatch,
    ResultsBatchStored,
    RunAssignment,
    RunFailure,
    UploadOutcome,
)
from decodebench.contracts.results import RunResult
from server.agents import service
from server.agents.longpoll import claim_for_agent
from server.auth import AgentToken, SessionDep, UserToken, bearer_given
from server.config import get_settings
from server.errors import AUTHENTICATED_ERRORS, DecodebenchError
from server.limits import ServerBusy, busy_response
from server.models import Run
from server.paths import RowId
from server.runs import results
from server.runs import service as runs
from server.runs.assignment import claim_assignment, claim_assignments

router = APIRouter(prefix="/api/v1", tags=["agents"], responses=AUTHENTICATED_ERRORS)


@router.post("/agents/register", response_model=AgentRegistered)
def register(body: AgentRegistration, token: AgentToken, session: SessionDep) -> AgentRegistered:
    agent = service.register_agent(session, token, body)
    settings = get_settings()
    return AgentRegistered(
        agent_id=agent.id,
        heartbeat_interval_s=settings.heartbeat_interval_s,
        lease_seconds=settings.lease_seconds,
    )


@router.post("/agents/heartbeat", status_code=204)
def heartbeat(body: Heartbeat, token: AgentToken, session: SessionDep) -> None:
    service.heartbeat(session, service.agent_for_token(session, token), body.devices)


@router.get("/devices", response_model=list[DeviceView])
def list_devices(token: UserToken, session: SessionDep) -> list[DeviceView]:
    """The fleet as the agents last reported it, including devices that went away."""
    return [
        DeviceView.model_validate(device, from_attributes=True)
        for device in service.list_devices(session)
    ]


@router.post("/agents/claim", response_model=ClaimResponse, dependencies=[Depends(bearer_given)])
async def claim(body: ClaimRequest, request: Request) -> ClaimResponse | JSONResponse:
    """Claim the next run for a device; with `wait_seconds`, a long poll answered the moment a
    run of the device's class becomes claimable (server/agents/longpoll.py)."""
    try:
        assignment = await claim_for_agent(
            request,
            body.wait_seconds,
            lambda session, agent_id, settings: claim_assignment(
                session, agent_id, body.device_udid, settings, body.claim_key
            ),
            None,
        )
    except ServerBusy:
        return busy_response()
    return ClaimResponse(run=assignment)


@router.post("/agents/claims", response_model=ClaimsResponse, dependencies=[Depends(bearer_given)])
async def claim_many(body: ClaimsRequest, request: Request) -> ClaimsResponse | JSONResponse:
    """Claim runs for several of the agent's devices in one request (one look at the queue for
    all of them, one transaction): what an agent with many devices sends instead of a claim per
    device. Each device's claim keeps its own key and rules; with `wait_seconds`, answered as
    soon as one of the devices gets a run. A device of another agent fails the whole request
    (404) and claims nothing."""
    pairs = [(claim.device_udid, claim.claim_key) for claim in body.claims]
    nothing: dict[str, RunAssignment] = {}
    try:
        given = await claim_for_agent(
            request,
            body.wait_seconds,
            lambda session, agent_id, settings: claim_assignments(
                session, agent_id, pairs, settings
            ),
            nothing,
        )
    except ServerBusy:
        return busy_response()
    return ClaimsResponse(
        runs=[DeviceRun(device_udid=udid, run=run) for udid, run in given.items()]
    )


@router.post("/runs/{run_id}/lease", response_model=LeaseRenewal)
def renew(run_id: RowId, token: AgentToken, session: SessionDep) -> LeaseRenewal:
    agent = service.agent_for_token(session, token)
    run = runs.renew_lease(session, run_id, agent.id, get_settings().lease_seconds)
    assert run.lease_expires_at is not None
    return LeaseRenewal(lease_expires_at=run.lease_expires_at.isoformat())


@router.post("/runs/{run_id}/results", response_model=ResultsStored)
def upload_results(
    run_id: RowId, body: RunResult, token: AgentToken, session: SessionDep
) -> ResultsStored:
    """One run's results: a batch of one (`POST /agents/results`), its refusal the answer."""
    agent = service.agent_for_token(session, token)
    ((_, stored),) = results.store_results(session, agent.id, [(run_id, body)])
    if isinstance(stored, DecodebenchError):
        raise stored
    assert stored.summary is not None
    return ResultsStored(
        run_id=stored.id, state=RunState(stored.state), prompts_stored=stored.summary["prompts"]
    )


@router.post("/agents/results", response_model=ResultsBatchStored)
def upload_many(body: ResultsBatch, token: AgentToken, session: SessionDep) -> ResultsBatchStored:
    """Several finished runs' results in one request and one transaction: what an agent with
    many devices sends instead of an upload per run. Each run is stored or refused on its own
    (its outcome's status is what its upload alone would have been answered), so one refused
    run does not hold back the others."""
    agent = service.agent_for_token(session, token)
    stored = results.store_results(
        session, agent.id, [(upload.run_id, upload.result) for upload in body.uploads]
    )
    return ResultsBatchStored(outcomes=[_outcome(run_id, run) for run_id, run in stored])


def _outcome(run_id: int, stored: Run | DecodebenchError) -> UploadOutcome:
    if isinstance(stored, DecodebenchError):
        return UploadOutcome(run_id=run_id, status=stored.status_code, detail=str(stored))
    assert stored.summary is not None
    return UploadOutcome(
        run_id=run_id,
        status=200,
        state=RunState(stored.state),
        prompts_stored=stored.summary["prompts"],
    )


@router.post("/runs/{run_id}/fail", response_model=RunStateView)
def fail(run_id: RowId, body: RunFailure, token: AgentToken, session: SessionDep) -> RunStateView:
    agent = service.agent_for_token(session, token)
    max_attempts = get_settings().max_run_attempts
    run = runs.fail_run(session, run_id, agent.id, body.reason, body.retryable, max_attempts)
    return RunStateView(state=RunState(run.state))
