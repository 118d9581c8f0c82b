"""Schedules API: users manage schedules and read series and alerts; beat ticks as a worker."""

from __future__ import annotations

from fastapi import APIRouter

from decodebench.contracts.schedules import (
    AlertStatus,
    AlertView,
    DeliveryResult,
    FiringView,
    ScheduleView,
    SeriesView,
    TickRequest,
    TickResult,
)
from server.auth import SessionDep, SubmitToken, UserToken, WorkerToken
from server.errors import AUTHENTICATED_ERRORS
from server.paths import QueryRowId, RowId
from server.schedules import detection, service, views, webhooks
from server.schedules.requests import ScheduleRequest

router = APIRouter(prefix="/api/v1/schedules", tags=["schedules"], responses=AUTHENTICATED_ERRORS)
alerts_router = APIRouter(
    prefix="/api/v1/alerts", tags=["schedules"], responses=AUTHENTICATED_ERRORS
)


@router.post("", status_code=201, response_model=ScheduleView)
def create_schedule(
    request: ScheduleRequest, token: SubmitToken, session: SessionDep
) -> ScheduleView:
    return views.schedule_view(service.create_schedule(session, request, token.name))


@router.get("", response_model=list[ScheduleView])
def list_schedules(token: UserToken, session: SessionDep) -> list[ScheduleView]:
    return [views.schedule_view(schedule) for schedule in service.list_schedules(session)]


@router.post("/tick", response_model=TickResult)
def tick(request: TickRequest, token: WorkerToken, session: SessionDep) -> TickResult:
    """Beat's tick: start what is due (each due time once), judge the nights that finished."""
    now = service.clock(request.now)
    fired = service.fire_due(session, now)
    completed, raised = detection.record_finished_nights(session)
    decided = detection.decide_confirmations(session)
    session.flush()
    return TickResult(
        fired=[firing.id for firing in fired],
        completed=[firing.id for firing in completed],
        alerts=[alert.id for alert in [*raised, *decided]],
    )


@router.post("/webhooks/deliver", response_model=DeliveryResult)
def deliver_webhooks(token: WorkerToken) -> DeliveryResult:
    """Send due webhook notifications (each attempt in its own transaction, after the commit
    that queued it)."""
    attempted, delivered = webhooks.deliver_due()
    return DeliveryResult(attempted=attempted, delivered=delivered)


@router.get("/{schedule_id}", response_model=ScheduleView)
def get_schedule(schedule_id: RowId, token: UserToken, session: SessionDep) -> ScheduleView:
    return views.schedule_view(service.get_schedule(session, schedule_id))


@router.post("/{schedule_id}/pause", response_model=ScheduleView)
def pause(schedule_id: RowId, token: SubmitToken, session: SessionDep) -> ScheduleView:
    return views.schedule_view(service.set_enabled(session, schedule_id, False))


@router.post("/{schedule_id}/resume", response_model=ScheduleView)
def resume(schedule_id: RowId, token: SubmitToken, session: SessionDep) -> ScheduleView:
    return views.schedule_view(service.set_enabled(session, schedule_id, True))


@router.post("/{schedule_id}/run-now", status_code=201, response_model=FiringView)
def run_now(
    schedule_id: RowId, request: TickRequest, token: SubmitToken, session: SessionDep
) -> FiringView:
    firing = service.run_now(session, schedule_id, service.clock(request.now))
    session.flush()
    return views.firing_view(firing)


@router.get("/{schedule_id}/firings", response_model=list[FiringView])
def firings(schedule_id: RowId, token: UserToken, session: SessionDep) -> list[FiringView]:
    return [views.firing_view(f) for f in service.firings_of(session, schedule_id)]


@router.get("/{schedule_id}/series", response_model=list[SeriesView])
def series(schedule_id: RowId, token: UserToken, session: SessionDep) -> list[SeriesView]:
    return views.schedule_series(session, service.get_schedule(session, schedule_id))


@alerts_router.get("", response_model=list[AlertView])
def list_alerts(
    token: UserToken,
    session: SessionDep,
    schedule_id: QueryRowId | None = None,
    status: AlertStatus | None = None,
) -> list[AlertView]:
    return views.list_alerts(session, schedule_id, status)
