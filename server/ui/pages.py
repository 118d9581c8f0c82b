"""Server-rendered pages: the same services as the API, rendered with Jinja."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from pydantic import ValidationError

from decodebench.contracts.domain import Attention, KVCache, SweepSpec
from decodebench.presets import PRESETS
from decodebench.profiles import DEVICE_PROFILES
from server.agents.service import list_devices
from server.auth import UI_COOKIE, SessionDep, lookup_token
from server.builds.diff import diff_builds
from server.config import get_settings
from server.errors import Conflict
from server.models import ApiToken, Scope, TokenKind
from server.paths import DeviceClass, RowId
from server.profiles import service as profiles_service
from server.profiles.views import current_profile_views
from server.sweeps import service
from server.sweeps.views import sweep_detail
from server.ui.forms import MAX_FORM_VARIANTS, sweep_spec_from_form, validation_messages

templates = Jinja2Templates(directory=Path(__file__).resolve().parent.parent / "templates")
router = APIRouter(include_in_schema=False)


class LoginRequired(Exception):
    pass


def ui_user(request: Request, session: SessionDep) -> ApiToken:
    plain = request.cookies.get(UI_COOKIE)
    token = lookup_token(session, plain) if plain else None
    if token is None or token.kind != TokenKind.user.value:
        raise LoginRequired
    return token


UiUser = Annotated[ApiToken, Depends(ui_user)]


def _render(request: Request, name: str, status_code: int = 200, **context: Any) -> HTMLResponse:
    return templates.TemplateResponse(request, name, context, status_code=status_code)


@router.get("/login", response_class=HTMLResponse)
def login_page(request: Request) -> HTMLResponse:
    return _render(request, "login.html", error=None)


@router.post("/login")
def login(request: Request, session: SessionDep, token: Annotated[str, Form()]) -> Response:
    found = lookup_token(session, token.strip())
    if found is None or found.kind != TokenKind.user.value:
        return _render(request, "login.html", status_code=401, error="Unknown user token.")
    response = RedirectResponse("/", status_code=303)
    response.set_cookie(UI_COOKIE, token.strip(), httponly=True, samesite="strict")
    return response


@router.post("/logout")
def logout() -> Response:
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(UI_COOKIE)
    return response


@router.get("/", response_class=HTMLResponse)
def sweeps_page(request: Request, user: UiUser, session: SessionDep) -> HTMLResponse:
    return _render(request, "sweeps.html", sweeps=service.list_sweeps(session), user=user)


def _form_context(**extra: Any) -> dict[str, Any]:
    return {
        "presets": sorted(PRESETS),
        "device_profiles": DEVICE_PROFILES,
        "attentions": [attention.value for attention in Attention],
        "kv_modes": [kv.value for kv in KVCache],
        "quant_presets": ["fp16", "w8", "w4", "base", "top8", "top12"],
        "max_variants": MAX_FORM_VARIANTS,
        **extra,
    }


@router.get("/sweeps/new", response_class=HTMLResponse)
def new_sweep_page(request: Request, user: UiUser) -> HTMLResponse:
    return _render(request, "new_sweep.html", user=user, errors=[], form={}, **_form_context())


@router.post("/sweeps/new")
async def submit_sweep(request: Request, user: UiUser, session: SessionDep) -> Response:
    form = await request.form()
    try:
        spec: SweepSpec = sweep_spec_from_form(form)
    except ValidationError as error:
        return _render(
            request,
            "new_sweep.html",
            status_code=422,
            user=user,
            errors=validation_messages(error),
            form=form,
            **_form_context(),
        )
    sweep = service.submit_sweep(session, spec, user.name, get_settings().toolchain)
    return RedirectResponse(f"/sweeps/{sweep.id}", status_code=303)


@router.get("/sweeps/{sweep_id}", response_class=HTMLResponse)
def sweep_page(
    request: Request, sweep_id: RowId, user: UiUser, session: SessionDep
) -> HTMLResponse:
    detail = sweep_detail(session, service.get_sweep(session, sweep_id))
    return _render(request, "sweep.html", user=user, sweep=detail)


@router.get("/devices", response_class=HTMLResponse)
def devices_page(request: Request, user: UiUser, session: SessionDep) -> HTMLResponse:
    return _render(request, "devices.html", user=user, devices=list_devices(session))


@router.get("/profiles", response_class=HTMLResponse)
def profiles_page(request: Request, user: UiUser, session: SessionDep) -> HTMLResponse:
    return _render(
        request, "profiles.html", user=user, profiles=current_profile_views(session), error=None
    )


@router.post("/profiles/{device_class}/calibrate")
async def calibrate_profile(
    request: Request, device_class: DeviceClass, user: UiUser, session: SessionDep
) -> Response:
    form = await request.form()
    include_simulated = form.get("include_simulated") == "1"
    if Scope.admin.value not in user.scopes:
        return _render(
            request,
            "profiles.html",
            status_code=403,
            user=user,
            profiles=current_profile_views(session),
            error="Calibrating changes every user's predictions: it needs an admin token.",
        )
    try:
        profiles_service.calibrate(
            session, device_class, user.name, include_simulated=include_simulated
        )
    except Conflict as error:
        return _render(
            request,
            "profiles.html",
            status_code=409,
            user=user,
            profiles=current_profile_views(session),
            error=error.message,
        )
    return RedirectResponse("/profiles", status_code=303)


@router.get("/builds/{build_id}/diff/{other_id}", response_class=HTMLResponse)
def build_diff_page(
    request: Request, build_id: RowId, other_id: RowId, user: UiUser, session: SessionDep
) -> HTMLResponse:
    try:
        diff = diff_builds(session, build_id, other_id).model_dump(mode="json")
    except Conflict as error:
        return _render(
            request, "build_diff.html", status_code=409, user=user, diff=None, error=error.message
        )
    return _render(request, "build_diff.html", user=user, diff=diff, error=None)
