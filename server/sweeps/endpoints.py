from __future__ import annotations

from fastapi import APIRouter

from decodebench.contracts.api import RunView, SweepDetail, SweepOverview
from decodebench.contracts.domain import SweepSpec
from server.auth import SessionDep, SubmitToken, UserToken
from server.config import get_settings
from server.errors import AUTHENTICATED_ERRORS
from server.paths import RowId
from server.sweeps import control, service
from server.sweeps.views import run_view, sweep_detail, sweep_overview

router = APIRouter(prefix="/api/v1/sweeps", tags=["sweeps"], responses=AUTHENTICATED_ERRORS)


@router.post("", status_code=201, response_model=SweepDetail)
def submit_sweep(spec: SweepSpec, token: SubmitToken, session: SessionDep) -> SweepDetail:
    sweep = service.submit_sweep(session, spec, token.name, get_settings().toolchain)
    return sweep_detail(session, service.get_sweep(session, sweep.id))


@router.get("", response_model=list[SweepOverview])
def list_sweeps(token: UserToken, session: SessionDep) -> list[SweepOverview]:
    return [sweep_overview(sweep) for sweep in service.list_sweeps(session)]


@router.get("/{sweep_id}", response_model=SweepDetail)
def get_sweep(sweep_id: RowId, token: UserToken, session: SessionDep) -> SweepDetail:
    return sweep_detail(session, service.get_sweep(session, sweep_id))


@router.post("/{sweep_id}/cancel", response_model=SweepDetail)
def cancel_sweep(sweep_id: RowId, token: SubmitToken, session: SessionDep) -> SweepDetail:
    """Runs not yet started fail as "cancelled by <user>"; running runs finish. 409 when the
    sweep has already ended."""
    control.cancel_sweep(session, sweep_id, token.name)
    return sweep_detail(session, service.get_sweep(session, sweep_id))


@router.post("/{sweep_id}/runs/{run_id}/retry", response_model=RunView)
def retry_run(sweep_id: RowId, run_id: RowId, token: SubmitToken, session: SessionDep) -> RunView:
    """Queue a failed run again (attempts start over); 409 when the run has not failed or its
    build did."""
    return run_view(control.retry_run(session, sweep_id, run_id, token.name))
