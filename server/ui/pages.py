"""Server-rendered pages: the same services as the API, rendered with Jinja."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from pydantic import ValidationError
from sqlalchemy.orm import Session

from decodebench.contracts.domain import Attention, KVCache, SweepSpec
from decodebench.contracts.presets import PRESETS
from decodebench.contracts.profiles import DEVICE_PROFILES
from server import tenancy
from server.auth import SessionDep
from server.builds.diff import diff_builds
from server.config import get_settings
from server.errors import Conflict
from server.models import Scope
from server.paths import DeviceClass, RowId
from server.profiles import service as profiles_service
from server.profiles.views import current_profile_views
from server.schedules.spread import project_spreads
from server.sweeps import service
from server.sweeps.control import ready_devices_by_class
from server.ui.fleet import fleet_context
from server.ui.forms import (
    MAX_FORM_VARIANTS,
    field_errors,
    sweep_spec_from_form,
    unattached_classes,
)
from server.ui.frame import CheckedForm, UiUser, render

router = APIRouter(include_in_schema=False)


@router.get("/", response_class=HTMLResponse)
def sweeps_page(request: Request, user: UiUser, session: SessionDep) -> HTMLResponse:
    return render(request, "sweeps.html", sweeps=service.list_sweeps(session), user=user)


def _form_context(session: Session, **extra: Any) -> dict[str, Any]:
    return {
        "presets": PRESETS,
        "device_profiles": DEVICE_PROFILES,
        "ready": ready_devices_by_class(session),
        "attentions": [attention.value for attention in Attention],
        "kv_modes": [kv.value for kv in KVCache],
        "quant_presets": ["fp16", "w8", "w4", "base", "top1", "top2", "top8"],
        "max_variants": MAX_FORM_VARIANTS,
        "unschedulable_minutes": int(get_settings().unschedulable_wait_seconds // 60),
        **extra,
    }


@router.get("/sweeps/new", response_class=HTMLResponse)
def new_sweep_page(request: Request, user: UiUser, session: SessionDep) -> HTMLResponse:
    return render(
        request, "new_sweep.html", user=user, errors={}, form={}, **_form_context(session)
    )


@router.post("/sweeps/new")
def submit_sweep(
    request: Request, user: UiUser, form: CheckedForm, session: SessionDep
) -> Response:
    """Invalid input answers 422 with the form as typed and each message next to its field;
    a valid sweep is submitted and the browser redirected to its page (post/redirect/get)."""
    errors: dict[str, str] = {}
    try:
        spec: SweepSpec | None = sweep_spec_from_form(form)
    except ValidationError as error:
        spec, errors = None, field_errors(error, form)
    if form.get("confirm_unattached") != "1":
        errors = (
            unattached_classes(
                [str(item) for item in form.getlist("devices")], ready_devices_by_class(session)
            )
            | errors
        )
    if spec is None or errors:
        return render(
            request,
            "new_sweep.html",
            status_code=422,
            user=user,
            errors=errors,
            form=form,
            **_form_context(session),
        )
    sweep = service.submit_sweep(
        session, spec, user.name, get_settings().toolchain, project_id=tenancy.owner(session)
    )
    return RedirectResponse(f"/sweeps/{sweep.id}", status_code=303)


@router.get("/devices", response_class=HTMLResponse)
def devices_page(request: Request, user: UiUser, session: SessionDep) -> HTMLResponse:
    return render(request, "devices.html", user=user, **fleet_context(session))


@router.get("/profiles", response_class=HTMLResponse)
def profiles_page(
    request: Request, user: UiUser, session: SessionDep, error: str | None = None
) -> HTMLResponse:
    return render(
        request,
        "profiles.html",
        user=user,
        profiles=current_profile_views(session),
        spreads=project_spreads(session),
        error=error,
    )


@router.post("/profiles/{device_class}/calibrate")
def calibrate_profile(
    device_class: DeviceClass, user: UiUser, form: CheckedForm, session: SessionDep
) -> Response:
    """Post/redirect/get: success and refusal both land back on /profiles (a refusal with its
    reason), so reloading never re-posts."""
    include_simulated = form.get("include_simulated") == "1"
    if Scope.admin.value not in user.scopes:
        message = "Calibrating changes your project's predictions: it needs an admin token."
        return RedirectResponse(f"/profiles?error={quote(message)}", status_code=303)
    try:
        profiles_service.calibrate(
            session, device_class, user.name, include_simulated=include_simulated
        )
    except Conflict as error:
        return RedirectResponse(f"/profiles?error={quote(error.message)}", status_code=303)
    return RedirectResponse("/profiles", status_code=303)


@router.get("/builds/{build_id}/diff/{other_id}", response_class=HTMLResponse)
def build_diff_page(
    request: Request, build_id: RowId, other_id: RowId, user: UiUser, session: SessionDep
) -> HTMLResponse:
    try:
        diff = diff_builds(session, build_id, other_id).model_dump(mode="json")
    except Conflict as error:
        return render(
            request, "build_diff.html", status_code=409, user=user, diff=None, error=error.message
        )
    return render(request, "build_diff.html", user=user, diff=diff, error=None)
