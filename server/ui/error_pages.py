"""Errors on page routes answer an HTML page in the site's frame; the API keeps its JSON."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from starlette.exceptions import HTTPException

from server.errors import DecodebenchError
from server.ui.frame import LoginRequired, login_url, templates
from server.ui.security import is_page_path

logger = logging.getLogger(__name__)

_TITLES = {
    403: "Not allowed",
    404: "Not found",
    405: "Not allowed",
    409: "Not possible now",
    422: "Not valid",
    500: "Something went wrong",
}


def error_page(request: Request, status_code: int, message: str) -> HTMLResponse:
    return templates.TemplateResponse(
        request,
        "error.html",
        {
            "status_code": status_code,
            "title": _TITLES.get(status_code, "Error"),
            "message": message,
            "user": None,
        },
        status_code=status_code,
    )


def _plain_validation_message(exc: RequestValidationError) -> str:
    parts = []
    for error in exc.errors():
        where = " ".join(str(part) for part in error["loc"] if part not in ("path", "query"))
        parts.append(f"{where}: {error['msg']}" if where else error["msg"])
    return "; ".join(parts) or "the address is not valid"


def install_page_error_handlers(app: FastAPI) -> None:
    """Wraps the JSON handlers installed by ``install_error_handlers``: pages get HTML."""
    json_handlers = dict(app.exception_handlers)

    async def _delegate(request: Request, exc: Exception, kind: type) -> Response:
        handler = json_handlers.get(kind)
        if handler is None:  # Starlette's own HTTPException rendering
            from fastapi.exception_handlers import http_exception_handler

            return await http_exception_handler(request, exc)  # type: ignore[arg-type]
        return await handler(request, exc)

    @app.exception_handler(LoginRequired)
    async def _login(request: Request, exc: LoginRequired) -> RedirectResponse:
        return RedirectResponse(login_url(exc.next_path), status_code=303)

    @app.exception_handler(DecodebenchError)
    async def _domain(request: Request, exc: DecodebenchError) -> Response:
        if is_page_path(request.url.path):
            return error_page(request, exc.status_code, exc.message)
        return await _delegate(request, exc, DecodebenchError)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> Response:
        if is_page_path(request.url.path):
            return error_page(request, 422, _plain_validation_message(exc))
        return await _delegate(request, exc, RequestValidationError)

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException) -> Response:
        if is_page_path(request.url.path):
            message = "There is no page at this address." if exc.status_code == 404 else exc.detail
            return error_page(request, exc.status_code, str(message))
        return await _delegate(request, exc, HTTPException)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> Response:
        logger.exception("unhandled error on %s", request.url.path)
        if is_page_path(request.url.path):
            return error_page(request, 500, "The server failed to render this page; it is logged.")
        return Response('{"detail":"internal server error"}', 500, media_type="application/json")
