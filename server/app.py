"""The FastAPI application: REST API under /api/v1, pages at /, OpenAPI at /docs."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import RedirectResponse
from fastapi.staticfiles import StaticFiles

from decodebench import __version__
from server.agents.endpoints import router as agents_router
from server.artifacts.endpoints import router as artifacts_router
from server.builds.endpoints import router as builds_router
from server.errors import install_error_handlers
from server.health import router as health_router
from server.limits import install_limits
from server.profiles.endpoints import router as profiles_router
from server.sweeps.endpoints import router as sweeps_router
from server.ui.pages import LoginRequired
from server.ui.pages import router as ui_router


def create_app() -> FastAPI:
    app = FastAPI(
        title="decodebench",
        version=__version__,
        description="Measure and explain Core ML LLM decode speed on iPhones.",
    )
    install_error_handlers(app)

    @app.exception_handler(LoginRequired)
    async def _login(request: Request, exc: LoginRequired) -> RedirectResponse:
        return RedirectResponse("/login", status_code=303)

    install_limits(app)
    for router in (
        health_router,
        sweeps_router,
        builds_router,
        profiles_router,
        agents_router,
        artifacts_router,
        ui_router,
    ):
        app.include_router(router)
    static = Path(__file__).resolve().parent / "static"
    app.mount("/static", StaticFiles(directory=static), name="static")
    return app


app = create_app()
