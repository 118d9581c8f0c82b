"""`GET /api/v1/health`: answered on the event loop with its own connection and thread, so it
never queues behind requests waiting for the main pool or the request threads."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.exc import SQLAlchemyError

from decodebench import __version__
from decodebench.contracts.api import Health
from server.config import get_settings
from server.errors import error_responses

router = APIRouter(prefix="/api/v1", tags=["health"])
_PROBE_THREAD = ThreadPoolExecutor(max_workers=1, thread_name_prefix="health")


@lru_cache
def _probe_engine() -> Engine:
    settings = get_settings()
    return create_engine(
        settings.database_url,
        pool_size=1,
        max_overflow=0,
        pool_timeout=2,
        pool_pre_ping=True,
        connect_args=settings.libpq_timeouts,
    )


def _ping_database() -> None:
    with _probe_engine().connect() as connection:
        connection.execute(text("select 1"))


@router.get("/health", response_model=Health, responses=error_responses(503))
async def health() -> Health | JSONResponse:
    try:
        await asyncio.get_running_loop().run_in_executor(_PROBE_THREAD, _ping_database)
    except SQLAlchemyError as error:
        detail = f"database unreachable: {type(error).__name__}"
        return JSONResponse({"detail": detail}, status_code=503, headers={"Retry-After": "2"})
    return Health(status="ok", version=__version__)
