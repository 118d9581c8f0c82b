"""Signing in and out of the pages: a server-side session, rate-limited by client address."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated

from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from server.auth import SessionDep, lookup_token
from server.config import get_settings
from server.models import TokenKind
from server.sessions.service import (
    LOGIN_CSRF_COOKIE,
    SESSION_COOKIE,
    new_csrf_token,
    open_session,
    record_sign_in_failure,
    revoke_session,
    same_secret,
    sign_in_retry_after,
)
from server.ui.frame import CheckedForm, UiSessionDep, render, safe_next

router = APIRouter(include_in_schema=False)


def _secure_cookies() -> bool:
    return get_settings().environment not in ("development", "test")


def _login_form(
    request: Request,
    next_path: str,
    status_code: int = 200,
    error: str | None = None,
    headers: dict[str, str] | None = None,
) -> HTMLResponse:
    csrf = request.cookies.get(LOGIN_CSRF_COOKIE) or new_csrf_token()
    response = render(
        request, "login.html", status_code, error=error, next_path=next_path, csrf_token=csrf
    )
    response.set_cookie(
        LOGIN_CSRF_COOKIE,
        csrf,
        max_age=3600,
        httponly=True,
        samesite="strict",
        secure=_secure_cookies(),
    )
    for name, value in (headers or {}).items():
        response.headers[name] = value
    return response


@router.get("/login", response_class=HTMLResponse)
def login_page(request: Request, next: str | None = None) -> HTMLResponse:
    return _login_form(request, safe_next(next))


@router.post("/login")
def login(
    request: Request,
    session: SessionDep,
    token: Annotated[str, Form()],
    csrf_token: Annotated[str, Form()] = "",
    next: Annotated[str, Form()] = "/",
) -> Response:
    settings = get_settings()
    next_path = safe_next(next)
    if not same_secret(request.cookies.get(LOGIN_CSRF_COOKIE), csrf_token):
        return _login_form(request, next_path, 403, "The sign-in form expired: please retry.")
    client = request.client.host if request.client else "unknown"
    wait = sign_in_retry_after(
        session, client, settings.sign_in_failures_allowed, settings.sign_in_window_seconds
    )
    if wait is not None:
        return _login_form(
            request,
            next_path,
            429,
            f"Too many refused sign-ins: retry in {wait} s.",
            {"Retry-After": str(wait)},
        )
    found = lookup_token(session, token.strip())
    if found is None or found.kind != TokenKind.user.value:
        record_sign_in_failure(session, client, settings.sign_in_window_seconds)
        return _login_form(request, next_path, 401, "Unknown user token.")
    plain, _ = open_session(session, found, timedelta(hours=settings.ui_session_hours))
    response = RedirectResponse(next_path, status_code=303)
    response.set_cookie(
        SESSION_COOKIE,
        plain,
        max_age=int(settings.ui_session_hours * 3600),
        httponly=True,
        samesite="strict",
        secure=_secure_cookies(),
    )
    response.delete_cookie(LOGIN_CSRF_COOKIE)
    return response


@router.post("/logout")
def logout(request: Request, row: UiSessionDep, form: CheckedForm, session: SessionDep) -> Response:
    revoke_session(session, request.cookies[SESSION_COOKIE])
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(SESSION_COOKIE)
    return response
