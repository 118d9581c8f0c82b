"""The shape of a doctor job, shared by the API and its page."""

from __future__ import annotations

from sqlalchemy.orm import Session

from decodebench.contracts.doctor import DoctorReport
from decodebench.contracts.doctor_jobs import DoctorJobView, DoctorOverview, DoctorState
from decodebench.contracts.names import SweepState
from server.models import DoctorJob, UserModel
from server.sweeps.service import get_sweep
from server.sweeps.views import sweep_detail


def repaired_model_name(session: Session, job: DoctorJob) -> str | None:
    if job.repaired_model_id is None:
        return None
    model = session.get(UserModel, job.repaired_model_id)
    return model.name if model is not None else None


def job_overview(session: Session, job: DoctorJob) -> DoctorOverview:
    return DoctorOverview(
        id=job.id,
        state=DoctorState(job.state),
        package=job.package,
        devices=list(job.devices),
        progress=job.progress,
        stage=job.stage,
        repaired_model=repaired_model_name(session, job),
        sweep_id=job.sweep_id,
        created_at=job.created_at,
    )


def job_view(session: Session, job: DoctorJob) -> DoctorJobView:
    """The whole job: with the report (done) and the A/B sweep's rows."""
    view = DoctorJobView(
        id=job.id,
        state=DoctorState(job.state),
        package=job.package,
        package_sha256=job.package_sha256,
        tokenizer=job.tokenizer,
        prompts=job.prompts,
        steps=job.steps,
        devices=list(job.devices),
        progress=job.progress,
        stage=job.stage,
        error=job.error,
        attempts=job.attempts,
        submitted_by=job.submitted_by,
        created_at=job.created_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
        report=DoctorReport.model_validate(job.report) if job.report is not None else None,
        repaired_model=repaired_model_name(session, job),
        repaired_sha256=job.artifact_sha256,
        sweep_id=job.sweep_id,
    )
    if job.sweep_id is None:
        return view
    detail = sweep_detail(session, get_sweep(session, job.sweep_id))
    return view.model_copy(
        update={"sweep_state": SweepState(detail.state), "ab": list(detail.results)}
    )
