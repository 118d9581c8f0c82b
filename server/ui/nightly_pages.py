"""The nightly pages: the schedules with pause and resume, and a page per schedule with its
trend charts, firings and alerts."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from server.auth import SessionDep
from server.errors import Forbidden
from server.models import Scope
from server.paths import RowId
from server.schedules import service
from server.ui.frame import CheckedForm, UiUser, render, safe_next
from server.ui.nightly import schedule_context, schedules_context

router = APIRouter(include_in_schema=False)


@router.get("/schedules", response_class=HTMLResponse)
def schedules_page(request: Request, user: UiUser, session: SessionDep) -> HTMLResponse:
    return render(request, "schedules.html", user=user, **schedules_context(session))


@router.get("/schedules/{schedule_id}", response_class=HTMLResponse)
def schedule_page(
    request: Request, schedule_id: RowId, user: UiUser, session: SessionDep
) -> HTMLResponse:
    return render(request, "schedule.html", user=user, **schedule_context(session, schedule_id))


def _set_enabled(
    schedule_id: int, enabled: bool, user: UiUser, form: CheckedForm, session: SessionDep
) -> Response:
    """Post/redirect/get back to the page the form was on; the API's scope rule applies."""
    if Scope.submit.value not in user.scopes:
        raise Forbidden("pausing or resuming a schedule needs a user token with the submit scope")
    service.set_enabled(session, schedule_id, enabled)
    back = safe_next(str(form.get("next", "")))
    return RedirectResponse(back if back != "/" else "/schedules", status_code=303)


@router.post("/schedules/{schedule_id}/pause")
def pause_schedule(
    schedule_id: RowId, user: UiUser, form: CheckedForm, session: SessionDep
) -> Response:
    return _set_enabled(schedule_id, False, user, form, session)


@router.post("/schedules/{schedule_id}/resume")
def resume_schedule(
    schedule_id: RowId, user: UiUser, form: CheckedForm, session: SessionDep
) -> Response:
    return _set_enabled(schedule_id, True, user, form, session)
