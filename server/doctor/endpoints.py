"""``/api/v1/doctor``: doctor jobs for users (submit, read, download the repaired package) and
their life cycle for build workers (assignment, start, lease, progress, complete, fail,
reconcile)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import FileResponse

from decodebench.contracts.doctor_jobs import (
    DoctorAssignment,
    DoctorJobView,
    DoctorOutcome,
    DoctorOverview,
    DoctorRequest,
    DoctorState,
    DoctorStateView,
)
from server.artifacts.endpoints import StoreDep
from server.auth import SessionDep, SubmitToken, UserToken, WorkerToken
from server.config import get_settings
from server.doctor import service
from server.doctor.views import job_overview, job_view
from server.errors import AUTHENTICATED_ERRORS, Conflict
from server.lease_endpoints import add_lease_routes
from server.paths import RowId

router = APIRouter(prefix="/api/v1/doctor", tags=["doctor"], responses=AUTHENTICATED_ERRORS)
# Build workers: start, lease, progress, fail and reconcile, as for every leased kind
add_lease_routes(router, service.DOCTOR_JOBS, "job_id")


@router.post("", status_code=202, response_model=DoctorJobView)
def submit(request: DoctorRequest, token: SubmitToken, session: SessionDep) -> DoctorJobView:
    """Diagnose, repair and prove an uploaded package on the chat prompts, then measure it
    against its repair on the device classes: 202 with the queued job; 422 naming the field (an
    unknown or non-mlpackage model, an unknown device class), nothing written."""
    job = service.submit_job(session, request, token.name)
    session.flush()
    session.refresh(job)
    return job_view(session, job)


@router.get("", response_model=list[DoctorOverview])
def list_jobs(token: UserToken, session: SessionDep) -> list[DoctorOverview]:
    return [job_overview(session, job) for job in service.list_jobs(session)]


@router.get("/{job_id}", response_model=DoctorJobView)
def get_job(job_id: RowId, token: UserToken, session: SessionDep) -> DoctorJobView:
    """The job as one document: state, progress, the report, the repaired model, the A/B sweep."""
    return job_view(session, service.get_job(session, job_id, report=True))


@router.get(
    "/{job_id}/package",
    response_class=FileResponse,
    responses={
        200: {
            "description": "The repaired package, zipped",
            "content": {"application/zip": {"schema": {"type": "string", "format": "binary"}}},
        }
    },
)
def download_package(
    job_id: RowId, token: UserToken, session: SessionDep, store: StoreDep
) -> FileResponse:
    """The repaired package (a zip of ``<name>.mlpackage``); 409 until the job is done."""
    job = service.get_job(session, job_id)
    if job.state != DoctorState.done or job.artifact_sha256 is None:
        raise Conflict(f"doctor job {job_id} is {job.state}: the repaired package is not ready")
    name = service.repaired_model_name_of(session, job)
    return FileResponse(
        store.open_path(job.artifact_sha256),
        media_type="application/zip",
        filename=f"{name}.mlpackage.zip",
    )


# Build workers


@router.get("/{job_id}/assignment", response_model=DoctorAssignment)
def assignment(job_id: RowId, token: WorkerToken, session: SessionDep) -> DoctorAssignment:
    job = service.get_job(session, job_id)
    return DoctorAssignment(
        job_id=job.id,
        package=job.package,
        package_sha256=job.package_sha256,
        tokenizer=job.tokenizer,
        prompts=job.prompts,
        steps=job.steps,
        state=DoctorState(job.state),
    )


@router.post("/{job_id}/complete", response_model=DoctorStateView)
def complete(
    job_id: RowId, body: DoctorOutcome, token: WorkerToken, session: SessionDep, store: StoreDep
) -> DoctorStateView:
    """Store the report, register the repaired package as a model and submit the A/B sweep;
    409 from anyone not holding the job's lease (a second completion changes nothing)."""
    job = service.complete_job(session, job_id, body, store, get_settings())
    return DoctorStateView(state=DoctorState(job.state))
