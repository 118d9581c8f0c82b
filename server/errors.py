"""Domain errors carry their HTTP status; one handler renders them."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from decodebench.contracts.api import ErrorResponse
from decodebench.contracts.profiles import UnknownDeviceClass
from server.config import get_settings

logger = logging.getLogger(__name__)


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The error statuses an operation may answer with, for its OpenAPI document."""
    return {
        status: {"model": ErrorResponse, "description": _DESCRIPTIONS[status]}
        for status in statuses
    }


_DESCRIPTIONS = {
    400: "The body is not valid JSON",
    401: "No token, or an unknown or revoked one",
    403: "A token of another kind",
    404: "No such resource",
    409: "The resource is not in a state that allows this",
    413: "The request body is larger than the server accepts",
    422: "The request does not validate; the detail names the field",
    503: "The server is saturated or its database unreachable; retry after the Retry-After "
    "header's seconds",
}
# What every authenticated operation may answer besides success.
AUTHENTICATED_ERRORS = error_responses(400, 401, 403, 404, 409, 413, 422, 503)


class DecodebenchError(Exception):
    status_code = 400

    def __init__(self, message: str) -> None:
        self.message = message
        super().__init__(message)


class NotAuthenticated(DecodebenchError):
    status_code = 401


class Forbidden(DecodebenchError):
    status_code = 403


class NotFound(DecodebenchError):
    status_code = 404


class Conflict(DecodebenchError):
    status_code = 409


class InvalidInput(DecodebenchError):
    status_code = 422


class TooLarge(DecodebenchError):
    """Over a configured size limit; the message names the limit and its setting."""

    status_code = 413


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(DecodebenchError)
    async def _render(request: Request, exc: DecodebenchError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status_code == 401 else None
        return JSONResponse({"detail": exc.message}, status_code=exc.status_code, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        # The offending input is not echoed back: it may be huge, or not JSON at all (NaN).
        errors = [
            {"loc": list(error["loc"]), "msg": error["msg"], "type": error["type"]}
            for error in exc.errors()
        ]
        return JSONResponse({"detail": errors}, status_code=422)

    @app.exception_handler(PoolTimeout)
    async def _saturated(request: Request, exc: PoolTimeout) -> JSONResponse:
        # No database connection came free within the pool timeout: say so at once, and when
        # to come back, rather than letting clients and request threads pile up.
        retry_after = get_settings().retry_after_s
        return JSONResponse(
            {"detail": f"server busy: no database connection free; retry in {retry_after} s"},
            status_code=503,
            headers={"Retry-After": str(retry_after)},
        )

    @app.exception_handler(OperationalError)
    @app.exception_handler(InterfaceError)
    async def _database_away(request: Request, exc: Exception) -> JSONResponse:
        # The database went away mid-request (restarting, shutting down, unreachable) or gave
        # up a transaction it could retry (a deadlock): nothing was committed, so the client
        # is told to come back rather than handed a server error.
        retry_after = get_settings().retry_after_s
        logger.warning(
            "%s %s: database unavailable: %s",
            request.method, request.url.path, str(exc).partition("\n")[0][:300],
        )  # fmt: skip
        return JSONResponse(
            {"detail": f"the database is unavailable; retry in {retry_after} s"},
            status_code=503,
            headers={"Retry-After": str(retry_after)},
        )

    @app.exception_handler(UnknownDeviceClass)
    async def _unknown_device_class(request: Request, exc: UnknownDeviceClass) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=404)
