from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from decodebench.contracts.api import RunView, SweepDetail, SweepOverview, VerdictsView
from decodebench.contracts.domain import SweepSpec
from decodebench.contracts.verdicts import MAX_MIN_EFFECT
from server import tenancy
from server.auth import SessionDep, SubmitToken, UserToken
from server.config import get_settings
from server.errors import AUTHENTICATED_ERRORS
from server.paths import MAX_ROW_ID, RowId
from server.sweeps import control, service
from server.sweeps.verdict_cache import stored_verdicts
from server.sweeps.verdicts import verdicts_against_sweep
from server.sweeps.views import run_view, sweep_detail, sweep_overview

router = APIRouter(prefix="/api/v1/sweeps", tags=["sweeps"], responses=AUTHENTICATED_ERRORS)


@router.post("", status_code=201, response_model=SweepDetail)
def submit_sweep(spec: SweepSpec, token: SubmitToken, session: SessionDep) -> SweepDetail:
    sweep = service.submit_sweep(
        session, spec, token.name, get_settings().toolchain, project_id=tenancy.owner(session)
    )
    return sweep_detail(session, service.get_sweep(session, sweep.id))


@router.get("", response_model=list[SweepOverview])
def list_sweeps(token: UserToken, session: SessionDep) -> list[SweepOverview]:
    return [sweep_overview(sweep) for sweep in service.list_sweeps(session)]


@router.get("/{sweep_id}/verdicts", response_model=VerdictsView)
def get_verdicts(
    sweep_id: RowId,
    token: UserToken,
    session: SessionDep,
    baseline_sweep: Annotated[
        int | None, Query(ge=1, le=MAX_ROW_ID, description="Judge against this earlier sweep")
    ] = None,
    min_effect: Annotated[
        float | None, Query(gt=0, le=MAX_MIN_EFFECT, description="Default: the sweep's own")
    ] = None,
) -> VerdictsView:
    """The sweep's verdicts: against its baseline variant, or against the same variants of an
    earlier sweep of the same model (a CI gate against last night's sweep)."""
    sweep = service.get_sweep(session, sweep_id)
    spec = SweepSpec.model_validate(sweep.spec)
    effect = min_effect if min_effect is not None else spec.min_effect
    if baseline_sweep is None:
        rows, note = stored_verdicts(session, sweep, min_effect=effect)
        baseline = spec.baseline or spec.variants[0].label
    else:
        before = service.get_sweep(session, baseline_sweep)
        rows, note = verdicts_against_sweep(session, sweep, before, effect)
        baseline = f"sweep {before.id}"
    return VerdictsView(
        sweep_id=sweep.id, baseline=baseline, min_effect=effect, verdicts=rows, note=note
    )


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
