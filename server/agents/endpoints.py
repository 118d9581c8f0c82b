from __future__ import annotations

import asyncio
from contextlib import contextmanager

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from decodebench.contracts.api import DeviceView, ResultsStored, RunStateView
from decodebench.contracts.names import RunState
from decodebench.contracts.protocol import (
    AgentRegistered,
    AgentRegistration,
    ClaimRequest,
    ClaimResponse,
    Heartbeat,
    LeaseRenewal,
    RunAssignment,
    RunFailure,
    RunResult,
)
from server.agents import service
from server.agents.wakeup import claim_wakeups
from server.auth import AgentToken, SessionDep, UserToken, authenticated, bearer_given
from server.config import get_settings
from server.db import session_scope
from server.errors import AUTHENTICATED_ERRORS, Forbidden
from server.limits import ServerBusy, admitted, busy_response
from server.models import TokenKind
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


@router.post("/agents/claim", response_model=ClaimResponse, dependencies=[Depends(bearer_given)])
async def claim(body: ClaimRequest, request: Request) -> ClaimResponse | JSONResponse:
    """Claim the next run for a device; with `wait_seconds`, a long poll answered the moment a
    run of the device's class becomes claimable. Each look at the queue is a short transaction
    in a worker thread; between looks the request only awaits a notification
    (server/agents/wakeup.py), holding neither a database connection nor a thread."""
    try:
        return await _claim(body, request)
    except ServerBusy:
        return busy_response()


async def _claim(body: ClaimRequest, request: Request) -> ClaimResponse:
    settings = get_settings()
    if body.wait_seconds == 0:
        assignment, _ = await _look(request, body, 0.0)
        return ClaimResponse(run=assignment)
    wakeups = claim_wakeups(settings.database_url)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + body.wait_seconds
    # The body has been read: the next message is the client going away. A claim nobody
    # waits for any more ends there (its agent stopped, or gave up and will claim anew).
    gone: asyncio.Future[object] = asyncio.ensure_future(request.receive())
    try:
        while True:
            mark = wakeups.received
            try:
                assignment, device_class = await _look(request, body, deadline - loop.time())
            except ServerBusy:
                # It waited its turn to the end of its long poll (a look is never refused
                # sooner): answered as any long poll at its deadline, and claimed again at once.
                return ClaimResponse(run=None)
            remaining_s = deadline - loop.time()
            if assignment is not None or remaining_s <= 0 or gone.done():
                return ClaimResponse(run=assignment)
            if wakeups.notified_since(device_class, mark):
                continue  # a run became claimable while we looked: look again
            woken: asyncio.Future[object] = wakeups.wait_for(device_class)
            poll_s = remaining_s if wakeups.listening else settings.claim_fallback_poll_s
            try:
                awaited: set[asyncio.Future[object]] = {woken, gone}
                await asyncio.wait(
                    awaited, timeout=min(remaining_s, poll_s), return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                wakeups.forget(device_class, woken)
            if gone.done() or (loop.time() >= deadline and not woken.done()):
                return ClaimResponse(run=None)
    finally:
        gone.cancel()


async def _look(
    request: Request, body: ClaimRequest, wait_s: float
) -> tuple[RunAssignment | None, str]:
    """One look, admitted for its duration only, within the claims' share of the slots
    (server/limits.py); it may wait for that share for up to ``wait_s``."""
    async with admitted(claim_wait_s=wait_s):
        return await run_in_threadpool(_claim_once, request, body)


def _claim_once(request: Request, body: ClaimRequest) -> tuple[RunAssignment | None, str]:
    """One look at the queue in its own transaction: the assignment, and the device's class."""
    settings = get_settings()
    with contextmanager(session_scope)() as session:
        token = authenticated(request, session)
        if token.kind != TokenKind.agent.value:
            raise Forbidden(f"this endpoint needs a agent token, not a {token.kind} token")
        agent = service.agent_for_token(session, token)
        runs.expire_leases(session, settings.max_run_attempts)
        return claim_assignment(session, agent.id, body.device_udid, settings, body.claim_key)


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
