"""What every page shares: templates, the signed-in session, CSRF-checked forms, rendering."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import Depends, Request
from fastapi.responses import HTMLResponse
from fastapi.templating import Jinja2Templates
from starlette.datastructures import FormData

from server import tenancy
from server.auth import SessionDep
from server.errors import Forbidden
from server.models import ApiToken, UiSession
from server.sessions.service import SESSION_COOKIE, find_session, same_secret

templates = Jinja2Templates(directory=Path(__file__).resolve().parent.parent / "templates")


class LoginRequired(Exception):
    """Raised by a page that needs a signed-in user; answered with a redirect to /login that
    brings the user back to the page afterwards."""

    def __init__(self, next_path: str) -> None:
        self.next_path = next_path


def login_url(next_path: str) -> str:
    return "/login" if next_path in ("", "/") else f"/login?next={quote(next_path, safe='/')}"


def safe_next(value: str | None) -> str:
    """Only a path on this site: never another host (``//evil``, ``/\\evil``, ``https:``)."""
    if not value or not value.startswith("/") or value.startswith("//") or "\\" in value:
        return "/"
    return value


def ui_session(request: Request, session: SessionDep) -> UiSession:
    plain = request.cookies.get(SESSION_COOKIE)
    row = find_session(session, plain) if plain else None
    if row is None:
        path = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        raise LoginRequired(path if request.method == "GET" else "/")
    tenancy.bind(session, row.token)
    request.state.csrf_token = row.csrf_token
    return row


UiSessionDep = Annotated[UiSession, Depends(ui_session)]


def ui_user(row: UiSessionDep) -> ApiToken:
    return row.token


UiUser = Annotated[ApiToken, Depends(ui_user)]


async def checked_form(request: Request, row: UiSessionDep) -> FormData:
    """A posted form whose CSRF token matches the session's (the Origin is checked by the
    security middleware before this runs)."""
    form = await request.form()
    if not same_secret(row.csrf_token, str(form.get("csrf_token", ""))):
        raise Forbidden("the form's CSRF token is missing or stale: reload the page and retry")
    return form


CheckedForm = Annotated[FormData, Depends(checked_form)]


def render(request: Request, name: str, status_code: int = 200, **context: Any) -> HTMLResponse:
    context.setdefault("csrf_token", getattr(request.state, "csrf_token", ""))
    return templates.TemplateResponse(request, name, context, status_code=status_code)
