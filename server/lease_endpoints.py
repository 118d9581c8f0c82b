"""The routes every leased kind has, made once from its description (``server/leases.py``):
``POST {prefix}/{id}/start``, ``/{id}/lease``, ``/{id}/progress``, ``/{id}/fail`` and
``{prefix}/reconcile``. A kind's router adds its assignment and its completion."""

# No ``from __future__ import annotations``: FastAPI reads the routes' annotations, which name
# the path parameter made here for each kind.
from typing import Annotated, Any

from fastapi import APIRouter, Path

from decodebench.contracts.api import Reenqueued
from decodebench.contracts.base import Contract
from decodebench.contracts.leases import (
    Lease,
    LeaseFailure,
    LeaseProgress,
    LeaseStart,
    WorkerIdentity,
)
from server import leases
from server.auth import SessionDep, WorkerToken
from server.config import get_settings
from server.leases import LeasedKind
from server.paths import MAX_ROW_ID


def add_lease_routes(router: APIRouter, kind: LeasedKind[Any], id_name: str) -> None:
    """Add the leased routes of ``kind`` to its router; ``id_name`` is the path parameter's
    name in the OpenAPI document (``build_id``, ``job_id``)."""
    work_path = "/{" + id_name + "}"
    WorkId = Annotated[int, Path(alias=id_name, ge=1, le=MAX_ROW_ID, description="A row id")]

    @router.post(work_path + "/start", response_model=LeaseStart)
    def start(
        work_id: WorkId, body: WorkerIdentity, token: WorkerToken, session: SessionDep
    ) -> LeaseStart:
        seconds = kind.lease_seconds(get_settings())
        proceed, work = leases.start(session, kind, work_id, body.worker, seconds)
        if not proceed:
            return LeaseStart(proceed=False, state=work.state)
        return LeaseStart(
            proceed=True, state=work.state, lease=work.lease_token, lease_seconds=seconds
        )

    @router.post(work_path + "/lease", status_code=204)
    def renew(work_id: WorkId, body: Lease, token: WorkerToken, session: SessionDep) -> None:
        """The worker holding it is alive: its lease runs on."""
        leases.renew(session, kind, work_id, body.lease, kind.lease_seconds(get_settings()))

    @router.post(work_path + "/progress", status_code=204)
    def progress(
        work_id: WorkId, body: LeaseProgress, token: WorkerToken, session: SessionDep
    ) -> None:
        """What the worker is doing; renews the lease."""
        seconds = kind.lease_seconds(get_settings())
        leases.record_progress(session, kind, work_id, body, seconds)

    @router.post(work_path + "/fail", response_model=kind.state_view)
    def fail(
        work_id: WorkId, body: LeaseFailure, token: WorkerToken, session: SessionDep
    ) -> Contract:
        """The worker holding it gives up, saying why."""
        work = leases.fail(session, kind, work_id, body)
        return kind.state_view.model_validate({"state": work.state})

    @router.post("/reconcile", response_model=Reenqueued)
    def reconcile(token: WorkerToken, session: SessionDep) -> Reenqueued:
        """Queue again work whose worker's lease ran out, and re-send queued work no worker has
        started lately (its message may have been lost)."""
        return Reenqueued(reenqueued=leases.reconcile(session, kind, get_settings()))
