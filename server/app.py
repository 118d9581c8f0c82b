"""The FastAPI application: REST API under /api/v1, pages at /, OpenAPI at /docs."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import RedirectResponse
from fastapi.staticfiles import StaticFiles
from sqlalchemy import text

from decodebench import __version__
from decodebench.contracts.api import Health
from server.agents.endpoints import router as agents_router
from server.artifacts.endpoints import router as artifacts_router
from server.auth import SessionDep
from server.builds.endpoints import router as builds_router
from server.errors import install_error_handlers
from server.profiles.endpoints import router as profiles_router
from server.schedules.endpoints import alerts_router
from server.schedules.endpoints import router as schedules_router
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

    @app.get("/api/v1/health", tags=["health"], response_model=Health)
    def health(session: SessionDep) -> Health:
        session.execute(text("select 1"))
        return Health(status="ok", version=__version__)

    for router in (
        sweeps_router,
        builds_router,
        profiles_router,
        agents_router,
        artifacts_router,
        schedules_router,
        alerts_router,
        ui_router,
    ):
        app.include_router(router)
    static = Path(__file__).resolve().parent / "static"
    app.mount("/static", StaticFiles(directory=static), name="static")
    return app


app = create_app()
