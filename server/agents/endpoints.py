from __future__ import annotations

from fastapi import APIRouter

from decodebench.contracts.api import DeviceView, ResultsStored, RunStateView
from decodebench.contracts.names import RunState
from decodebench.contracts.protocol import (
    AgentRegistered,
    AgentRegistration,
    ClaimRequest,
    ClaimResponse,
    Heartbeat,
    LeaseRenewal,
    RunFailure,
    RunResult,
)
from server.agents import service
from server.auth import AgentToken, SessionDep, UserToken
from server.config import get_settings
from server.errors import AUTHENTICATED_ERRORS
from server.paths import RowId
from server.runs import service as runs
from server.runs.assignment import claim_assignment

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


@router.post("/agents/claim", response_model=ClaimResponse)
def claim(body: ClaimRequest, token: AgentToken, session: SessionDep) -> ClaimResponse:
    agent = service.agent_for_token(session, token)
    settings = get_settings()
    runs.expire_leases(session, settings.max_run_attempts)
    return ClaimResponse(
        run=claim_assignment(session, agent.id, body.device_udid, settings, body.claim_key)
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
    agent = service.agent_for_token(session, token)
    run = runs.record_results(session, run_id, agent.id, body)
    assert run.summary is not None
    return ResultsStored(
        run_id=run.id, state=RunState(run.state), prompts_stored=run.summary["prompts"]
    )


@router.post("/runs/{run_id}/fail", response_model=RunStateView)
def fail(run_id: RowId, body: RunFailure, token: AgentToken, session: SessionDep) -> RunStateView:
    agent = service.agent_for_token(session, token)
    max_attempts = get_settings().max_run_attempts
    run = runs.fail_run(session, run_id, agent.id, body.reason, body.retryable, max_attempts)
    return RunStateView(state=RunState(run.state))
