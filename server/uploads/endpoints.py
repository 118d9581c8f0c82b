"""``/api/v1/uploads``: chunked, resumable uploads into the artifact store."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Request

from decodebench.contracts.uploads import UploadCreate, UploadFinish, UploadView
from server.artifacts.endpoints import StoreDep
from server.auth import SessionDep, SubmitToken
from server.config import get_settings
from server.errors import AUTHENTICATED_ERRORS, Conflict
from server.uploads import service

router = APIRouter(prefix="/api/v1/uploads", tags=["uploads"], responses=AUTHENTICATED_ERRORS)

UploadId = Annotated[
    str, Path(pattern=r"^[0-9a-f]{32}$", description="The upload's id (32 hex digits)")
]


@router.post("", status_code=201, response_model=UploadView)
def create_upload(
    request: UploadCreate, token: SubmitToken, session: SessionDep, store: StoreDep
) -> UploadView:
    """Announce a file (name and size); send its bytes with PUT, then finish with its sha256."""
    upload = service.create_upload(session, request, token.name, store, get_settings())
    return service.view(store, upload)


@router.get("/{upload_id}", response_model=UploadView)
def get_upload(
    upload_id: UploadId, token: SubmitToken, session: SessionDep, store: StoreDep
) -> UploadView:
    """The offset reached: an interrupted upload resumes there."""
    return service.view(store, service.get_upload(session, upload_id, token.name))


def open_upload(
    upload_id: UploadId, token: SubmitToken, session: SessionDep, store: StoreDep
) -> UploadView:
    """The caller's open upload (read in a thread: the chunk itself streams on the loop)."""
    upload = service.get_upload(session, upload_id, token.name)
    if upload.state != service.OPEN:
        raise Conflict(f"upload {upload_id} is finished; it takes no more bytes")
    return service.view(store, upload)


@router.put("/{upload_id}", response_model=UploadView)
async def put_chunk(
    request: Request,
    upload: Annotated[UploadView, Depends(open_upload)],
    store: StoreDep,
    offset: Annotated[
        int, Query(ge=0, le=2**62, description="Where the body goes: the current offset")
    ],
) -> UploadView:
    """Write the body at ``offset``; 409 names the current offset when it is another."""
    reached = await service.write_chunk(store, upload.id, upload.size, offset, request.stream())
    return upload.model_copy(update={"offset": reached})


@router.post("/{upload_id}/finish", response_model=UploadView)
def finish_upload(
    upload_id: UploadId,
    request: UploadFinish,
    token: SubmitToken,
    session: SessionDep,
    store: StoreDep,
) -> UploadView:
    """Check the bytes against ``sha256`` and put them into the artifact store (422 and reset
    to offset 0 when they differ)."""
    upload = service.finish_upload(session, upload_id, request.sha256, token.name, store)
    return service.view(store, upload)
