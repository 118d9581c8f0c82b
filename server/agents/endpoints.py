from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import contextmanager
from typing import TypeVar

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

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
from server.agents.wakeup import claim_wakeups
from server.auth import AgentToken, SessionDep, UserToken, authenticated, bearer_given
from server.config import Settings, get_settings
from server.db import session_scope
from server.errors import AUTHENTICATED_ERRORS, Conflict, Forbidden, InvalidInput, NotFound
from server.limits import ServerBusy, admitted, busy_response
from server.models import TokenKind
from server.paths import RowId
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
    run of the device's class becomes claimable. Each look at the queue is a short transaction
    in a worker thread; between looks the request only awaits a notification
    (server/agents/wakeup.py), holding neither a database connection nor a thread."""

    def look() -> tuple[RunAssignment | None, set[str]]:
        assignment, device_class = _in_agent_transaction(
            request,
            lambda session, agent_id, settings: claim_assignment(
                session, agent_id, body.device_udid, settings, body.claim_key
            ),
        )
        return assignment, {device_class}

    try:
        assignment = await _long_poll(request, body.wait_seconds, look, None)
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

    def look() -> tuple[dict[str, RunAssignment], set[str]]:
        return _in_agent_transaction(
            request,
            lambda session, agent_id, settings: claim_assignments(
                session, agent_id, pairs, settings
            ),
        )

    try:
        nothing: dict[str, RunAssignment] = {}
        given = await _long_poll(request, body.wait_seconds, look, nothing)
    except ServerBusy:
        return busy_response()
    return ClaimsResponse(
        runs=[DeviceRun(device_udid=udid, run=run) for udid, run in given.items()]
    )


_Found = TypeVar("_Found")


async def _long_poll(
    request: Request,
    wait_seconds: int,
    look: Callable[[], tuple[_Found, set[str]]],
    nothing: _Found,
) -> _Found:
    """Look at the queue (``look``: what it found, and the device classes still waiting) until
    it finds something, the client goes away, or ``wait_seconds`` have passed; between looks
    await a wake-up of one of the waiting classes."""
    settings = get_settings()
    if wait_seconds == 0:
        found, _ = await _look(look, 0.0)
        return found
    wakeups = claim_wakeups(settings.database_url)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_seconds
    # The body has been read: the next message is the client going away. A claim nobody
    # waits for any more ends there (its agent stopped, or gave up and will claim anew).
    gone: asyncio.Future[object] = asyncio.ensure_future(request.receive())
    try:
        while True:
            mark = wakeups.received
            try:
                found, classes = await _look(look, deadline - loop.time())
            except ServerBusy:
                # It waited its turn to the end of its long poll (a look is never refused
                # sooner): answered as any long poll at its deadline, and claimed again at once.
                return nothing
            remaining_s = deadline - loop.time()
            if found or remaining_s <= 0 or gone.done() or not classes:
                return found
            if any(wakeups.notified_since(device_class, mark) for device_class in classes):
                continue  # a run became claimable while we looked: look again
            woken = {device_class: wakeups.wait_for(device_class) for device_class in classes}
            poll_s = remaining_s if wakeups.listening else settings.claim_fallback_poll_s
            try:
                awaited: set[asyncio.Future[object]] = {*woken.values(), gone}
                await asyncio.wait(
                    awaited, timeout=min(remaining_s, poll_s), return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                for device_class, future in woken.items():
                    wakeups.forget(device_class, future)
            any_woken = any(future.done() for future in woken.values())
            if gone.done() or (loop.time() >= deadline and not any_woken):
                return nothing
    finally:
        gone.cancel()


async def _look(
    look: Callable[[], tuple[_Found, set[str]]], wait_s: float
) -> tuple[_Found, set[str]]:
    """One look, admitted for its duration only, within the claims' share of the slots
    (server/limits.py); it may wait for that share for up to ``wait_s``."""
    async with admitted(claim_wait_s=wait_s):
        return await run_in_threadpool(look)


def _in_agent_transaction(
    request: Request, work: Callable[[Session, int, Settings], _Found]
) -> _Found:
    """``work`` for the request's agent in one transaction (its token checked in it too), with
    the leases that ran out given back to the queue first."""
    settings = get_settings()
    with contextmanager(session_scope)() as session:
        token = authenticated(request, session)
        if token.kind != TokenKind.agent.value:
            raise Forbidden(f"this endpoint needs a agent token, not a {token.kind} token")
        agent = service.agent_for_token(session, token)
        runs.expire_leases(session, settings.max_run_attempts)
        return work(session, agent.id, settings)


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


@router.post("/agents/results", response_model=ResultsBatchStored)
def upload_many(body: ResultsBatch, token: AgentToken, session: SessionDep) -> ResultsBatchStored:
    """Several finished runs' results in one request and one transaction: what an agent with
    many devices sends instead of an upload per run. Each run is stored or refused on its own
    (its outcome's status is what its upload alone would have been answered), so one refused
    run does not hold back the others."""
    agent = service.agent_for_token(session, token)
    outcomes = []
    # The runs are locked in run order: two batches cannot deadlock.
    batch = runs.runs_for_results(
        session, [(upload.run_id, upload.result.device_udid) for upload in body.uploads]
    )
    # The runs' changes are flushed together at the end (an UPDATE for all, an INSERT of all
    # their transitions), not run by run before the next one's statements.
    with session.no_autoflush:
        for upload in sorted(body.uploads, key=lambda upload: upload.run_id):
            try:
                run = runs.record_results(session, upload.run_id, agent.id, upload.result, batch)
            except (NotFound, Conflict, InvalidInput) as error:
                outcomes.append(
                    UploadOutcome(run_id=upload.run_id, status=error.status_code, detail=str(error))
                )
                continue
            assert run.summary is not None
            outcomes.append(
                UploadOutcome(
                    run_id=run.id,
                    status=200,
                    state=RunState(run.state),
                    prompts_stored=run.summary["prompts"],
                )
            )
    return ResultsBatchStored(outcomes=outcomes)


@router.post("/runs/{run_id}/fail", response_model=RunStateView)
def fail(run_id: RowId, body: RunFailure, token: AgentToken, session: SessionDep) -> RunStateView:
    agent = service.agent_for_token(session, token)
    max_attempts = get_settings().max_run_attempts
    run = runs.fail_run(session, run_id, agent.id, body.reason, body.retryable, max_attempts)
    return RunStateView(state=RunState(run.state))
