"""The shape of a sweep, shared by the API and the pages."""

from __future__ import annotations

from sqlalchemy.orm import Session

from decodebench.contracts.api import RunSummary, RunView, SweepDetail, SweepOverview
from decodebench.contracts.domain import SweepSpec
from decodebench.contracts.names import Driver, RunState, SweepState
from server.builds.views import build_view
from server.models import Run, Sweep
from server.sweeps.answers import answers_and_agreements
from server.sweeps.comparison import comparison
from server.sweeps.service import runs_of
from server.sweeps.verdict_cache import stored_verdicts


def run_view(run: Run) -> RunView:
    return RunView(
        id=run.id,
        variant=run.variant.label,
        device_class=run.device_class,
        repetition=run.repetition,
        order_key=run.order_key,
        state=RunState(run.state),
        attempts=run.attempts,
        device_udid=run.device_udid,
        simulated=run.simulated,
        driver=Driver(run.driver) if run.driver else None,
        failure_reason=run.failure_reason,
        summary=RunSummary.model_validate(run.summary) if run.summary else None,
    )


def sweep_overview(sweep: Sweep) -> SweepOverview:
    return SweepOverview(
        id=sweep.id,
        model=sweep.model,
        state=SweepState(sweep.state),
        submitted_by=sweep.submitted_by,
        created_at=sweep.created_at,
        finished_at=sweep.finished_at,
        variants=[variant.label for variant in sweep.variants],
        devices=sweep.spec["devices"],
    )


def sweep_detail(session: Session, sweep: Sweep) -> SweepDetail:
    runs = runs_of(session, sweep.id)
    spec = SweepSpec.model_validate(sweep.spec)
    verdicts, note = stored_verdicts(session, sweep)
    by_cell = {(verdict.variant, verdict.device_class): verdict for verdict in verdicts}
    answers, agreements = answers_and_agreements(session, sweep)
    builds = [build_view(variant.build, label=variant.label) for variant in sweep.variants]
    analyses = {build.id: build.analysis for build in builds}
    table = [
        row.model_copy(
            update={
                "verdict": by_cell.get((row.variant, row.device_class)),
                "reference_agreement": agreements.get((row.variant, row.device_class)),
            }
        )
        for row in comparison(session, sweep, runs, analyses)
    ]
    return SweepDetail(
        **sweep_overview(sweep).model_dump(),
        spec=spec,
        baseline=spec.baseline or spec.variants[0].label,
        min_effect=spec.min_effect,
        verdicts=verdicts,
        verdicts_note=note,
        builds=builds,
        results=table,
        simulated=any(row.simulated for row in table),
        runs=[run_view(run) for run in runs],
        answers=answers,
    )
