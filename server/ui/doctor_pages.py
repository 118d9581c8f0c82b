"""The doctor job's pages: the report (hazards, waste, repairs, agreement, speed, download),
progress while it runs, and a form to start one on an uploaded package."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse, Response
from pydantic import ValidationError
from sqlalchemy import select

from decodebench.contracts.doctor import FP16_MAX
from decodebench.contracts.doctor_jobs import (
    DEFAULT_TOKENIZER,
    MAX_DOCTOR_PROMPTS,
    MAX_DOCTOR_STEPS,
    DoctorRequest,
    DoctorState,
)
from decodebench.contracts.profiles import DEVICE_PROFILES
from decodebench.contracts.uploads import ModelKind
from server import tenancy
from server.artifacts.endpoints import StoreDep
from server.auth import SessionDep
from server.doctor import service
from server.doctor.views import job_overview, job_view
from server.errors import Conflict, InvalidInput
from server.models import UserModel
from server.paths import RowId
from server.ui.frame import CheckedForm, UiUser, render

router = APIRouter(include_in_schema=False)
REFRESH_SECONDS = 5


def _packages(session) -> list[str]:
    return list(
        session.scalars(
            select(UserModel.name)
            .where(UserModel.kind == ModelKind.package.value, tenancy.models(session))
            .order_by(UserModel.id.desc())
            .limit(200)
        )
    )


def _new_page(request: Request, user, session, error: str | None = None, status_code: int = 200):
    return render(
        request,
        "doctor_new.html",
        status_code=status_code,
        user=user,
        packages=_packages(session),
        device_profiles=DEVICE_PROFILES,
        jobs=[job_overview(session, job) for job in service.list_jobs(session)],
        default_tokenizer=DEFAULT_TOKENIZER,
        max_prompts=MAX_DOCTOR_PROMPTS,
        max_steps=MAX_DOCTOR_STEPS,
        error=error,
    )


@router.get("/doctor", response_class=HTMLResponse)
def doctor_jobs_page(request: Request, user: UiUser, session: SessionDep) -> HTMLResponse:
    return _new_page(request, user, session)


@router.post("/doctor")
def start_doctor_job(
    request: Request, user: UiUser, form: CheckedForm, session: SessionDep
) -> Response:
    def number(field: str) -> object:
        text = str(form.get(field, "")).strip()
        return int(text) if text.isdigit() else text

    body = {
        "package": str(form.get("package", "")),
        "tokenizer": str(form.get("tokenizer", "") or DEFAULT_TOKENIZER).strip(),
        "prompts": number("prompts"),
        "steps": number("steps"),
        "devices": [str(value) for value in form.getlist("devices")],
    }
    try:
        doctor_request = DoctorRequest.model_validate(body)
        job = service.submit_job(session, doctor_request, user.name)
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in item['loc'])}: {item['msg']}"
            for item in error.errors()
        )
        return _new_page(request, user, session, problems, status_code=422)
    except InvalidInput as error:
        session.rollback()
        return _new_page(request, user, session, error.message, status_code=422)
    session.flush()
    return RedirectResponse(f"/doctor/{job.id}", status_code=303)


@router.get("/doctor/{job_id}", response_class=HTMLResponse)
def doctor_page(request: Request, job_id: RowId, user: UiUser, session: SessionDep) -> HTMLResponse:
    view = job_view(session, service.get_job(session, job_id, report=True))
    report = view.report
    hazards = report.headroom.hazards if report else []
    overflowing_layers = sorted(
        {hazard.layer for hazard in hazards if hazard.overflows and hazard.layer is not None}
    )
    return render(
        request,
        "doctor.html",
        user=user,
        job=view,
        report=report,
        overflows=[hazard for hazard in hazards if hazard.overflows],
        close=[hazard for hazard in hazards if not hazard.overflows],
        overflowing_layers=overflowing_layers,
        head_overflows=any(h.overflows and h.layer is None for h in hazards),
        fp16_max=FP16_MAX,
        device_profiles=DEVICE_PROFILES,
        simulated=any(row.simulated for row in view.ab),
        refresh=REFRESH_SECONDS
        if view.state in (DoctorState.queued, DoctorState.running)
        else None,
    )


@router.get("/doctor/{job_id}/download")
def download_repaired(
    job_id: RowId, user: UiUser, session: SessionDep, store: StoreDep
) -> FileResponse:
    job = service.get_job(session, job_id)
    if job.state != DoctorState.done or job.artifact_sha256 is None:
        raise Conflict(f"doctor job {job_id} is {job.state}: the repaired package is not ready")
    return FileResponse(
        store.open_path(job.artifact_sha256),
        media_type="application/zip",
        filename=f"{service.repaired_model_name_of(session, job)}.mlpackage.zip",
    )
