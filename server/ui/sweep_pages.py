"""The sweep page: charts, live progress (a fragment the page's script fetches), cancel, retry,
and why a run is not being scheduled."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from sqlalchemy.orm import Session

from decodebench.contracts.names import RunState
from server.auth import SessionDep
from server.paths import RowId
from server.sweeps import control, service
from server.sweeps.views import sweep_detail
from server.ui.frame import CheckedForm, UiUser, render
from server.ui.sweep_charts import sweep_charts, verdict_of

router = APIRouter(include_in_schema=False)


def sweep_context(session: Session, sweep_id: int) -> dict[str, Any]:
    detail = sweep_detail(session, service.get_sweep(session, sweep_id))
    waiting = {run.device_class for run in detail.runs if run.state == RunState.queued}
    return {
        "sweep": detail,
        "charts": sweep_charts(session, detail),
        "unschedulable": control.unschedulable_reasons(session, waiting) if waiting else {},
        "verdict_of": verdict_of,
        "live": detail.state in ("building", "running"),
    }


@router.get("/sweeps/{sweep_id}", response_class=HTMLResponse)
def sweep_page(
    request: Request, sweep_id: RowId, user: UiUser, session: SessionDep
) -> HTMLResponse:
    return render(request, "sweep.html", user=user, **sweep_context(session, sweep_id))


@router.get("/sweeps/{sweep_id}/live", response_class=HTMLResponse)
def sweep_fragment(
    request: Request, sweep_id: RowId, user: UiUser, session: SessionDep
) -> HTMLResponse:
    """The changing part of the sweep page, fetched by /static/sweep-live.js."""
    return render(request, "sweep_body.html", user=user, **sweep_context(session, sweep_id))


@router.post("/sweeps/{sweep_id}/cancel")
def cancel_sweep(sweep_id: RowId, user: UiUser, form: CheckedForm, session: SessionDep) -> Response:
    control.cancel_sweep(session, sweep_id, user.name)
    return RedirectResponse(f"/sweeps/{sweep_id}", status_code=303)


@router.post("/sweeps/{sweep_id}/runs/{run_id}/retry")
def retry_run(
    sweep_id: RowId, run_id: RowId, user: UiUser, form: CheckedForm, session: SessionDep
) -> Response:
    control.retry_run(session, sweep_id, run_id, user.name)
    return RedirectResponse(f"/sweeps/{sweep_id}", status_code=303)
