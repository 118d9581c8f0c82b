"""Domain errors carry their HTTP status; one handler renders them."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from decodebench.profiles import UnknownDeviceClass


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

    @app.exception_handler(UnknownDeviceClass)
    async def _unknown_device_class(request: Request, exc: UnknownDeviceClass) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=404)
