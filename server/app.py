"""The FastAPI application: REST API under /api/v1, pages at /, OpenAPI at /docs."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles
from sqlalchemy.orm import Session

from decodebench import __version__
from server.agents.endpoints import router as agents_router
from server.artifacts.endpoints import router as artifacts_router
from server.builds.endpoints import router as builds_router
from server.builds.service import RECONCILE_STEPS
from server.config import Settings, get_settings
from server.doctor.endpoints import router as doctor_router
from server.errors import install_error_handlers
from server.health import router as health_router
from server.limits import install_limits
from server.profiles.endpoints import router as profiles_router
from server.schedules.endpoints import alerts_router
from server.schedules.endpoints import router as schedules_router
from server.sweeps.control import fail_unschedulable_runs
from server.sweeps.endpoints import router as sweeps_router
from server.ui.build_pages import router as build_pages_router
from server.ui.docs import mount_docs
from server.ui.doctor_pages import router as doctor_pages_router
from server.ui.error_pages import install_page_error_handlers
from server.ui.nightly_pages import router as nightly_pages_router
from server.ui.pages import router as ui_router
from server.ui.security import SecurityMiddleware
from server.ui.sign_in import router as sign_in_router
from server.ui.sweep_pages import router as sweep_pages_router
from server.uploads.endpoints import router as uploads_router
from server.usermodels.endpoints import router as models_router


def _fail_unschedulable_runs(session: Session, settings: Settings) -> None:
    """Queued runs that waited too long for a device class with no ready device fail."""
    fail_unschedulable_runs(session, settings.unschedulable_wait_seconds)


# The reconcile the workers call lives with builds, below sweeps: it runs this step through
# RECONCILE_STEPS so builds need not import sweeps.
if _fail_unschedulable_runs not in RECONCILE_STEPS:
    RECONCILE_STEPS.append(_fail_unschedulable_runs)


def create_app() -> FastAPI:
    app = FastAPI(
        title="decodebench",
        version=__version__,
        description="Measure and explain Core ML LLM decode speed on iPhones.",
        docs_url=None,  # served offline by server.ui.docs
        redoc_url=None,
    )
    install_error_handlers(app)
    install_page_error_handlers(app)
    app.add_middleware(SecurityMiddleware, public_url=get_settings().public_url)

    install_limits(app)
    for router in (
        health_router,
        sweeps_router,
        builds_router,
        profiles_router,
        agents_router,
        artifacts_router,
        uploads_router,
        models_router,
        doctor_router,
        sign_in_router,
        schedules_router,
        alerts_router,
        ui_router,
        sweep_pages_router,  # after ui_router: /sweeps/new before /sweeps/{sweep_id}
        build_pages_router,
        nightly_pages_router,
        doctor_pages_router,
    ):
        app.include_router(router)
    static = Path(__file__).resolve().parent / "static"
    app.mount("/static", StaticFiles(directory=static), name="static")
    mount_docs(app)
    return app


app = create_app()
