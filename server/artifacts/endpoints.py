from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import FileResponse

from decodebench.contracts.api import ArtifactStored
from server import tenancy
from server.artifacts.store import ArtifactStore
from server.auth import AnyToken, SessionDep, WorkerToken
from server.config import get_settings
from server.errors import AUTHENTICATED_ERRORS, NotFound
from server.paths import Sha256

router = APIRouter(prefix="/api/v1/artifacts", tags=["artifacts"], responses=AUTHENTICATED_ERRORS)


def get_store() -> ArtifactStore:
    return ArtifactStore(get_settings().artifact_dir)


StoreDep = Annotated[ArtifactStore, Depends(get_store)]


@router.get(
    "/{sha256}",
    response_class=FileResponse,
    responses={
        200: {
            "description": "The zipped artifact",
            "content": {"application/zip": {"schema": {"type": "string", "format": "binary"}}},
        }
    },
)
def download_artifact(
    sha256: Sha256, token: AnyToken, store: StoreDep, session: SessionDep
) -> FileResponse:
    if not tenancy.artifact_visible(session, sha256):
        raise NotFound(f"no artifact {sha256}")
    return FileResponse(store.open_path(sha256), media_type="application/zip")


@router.put("/{sha256}", status_code=201, response_model=ArtifactStored)
async def upload_artifact(
    sha256: Sha256, request: Request, token: WorkerToken, store: StoreDep
) -> ArtifactStored:
    if not store.exists(sha256):
        await store.put_stream(sha256, request.stream())
    return ArtifactStored(sha256=sha256)
