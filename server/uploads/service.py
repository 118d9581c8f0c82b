"""Upload sessions: one file received in chunks at explicit offsets, then checked by its sha256
and moved into the content-addressed artifact store.

The bytes received so far are the file ``<artifact_dir>/uploads/<id>``; its length is the
offset, so what a cut connection delivered counts and the client resumes from there. One writer
at a time holds the file's lock; another is told 409. A finished upload whose bytes do not hash
to the announced sha256 is reset to offset 0 (nothing reaches the store). Uploads left open
are pruned by ``python -m server.manage prune-uploads``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import secrets
import time
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO

from sqlalchemy import select
from sqlalchemy.orm import Session

from decodebench.contracts.uploads import UploadCreate, UploadView
from server import tenancy
from server.artifacts.store import ArtifactStore
from server.config import Settings
from server.errors import Conflict, InvalidInput, NotFound, TooLarge
from server.models import Upload

OPEN, FINISHED = "open", "finished"
_HASH_CHUNK = 8 * 2**20


def partial_path(store: ArtifactStore, upload_id: str) -> Path:
    return store.root / "uploads" / upload_id


def offset_of(store: ArtifactStore, upload: Upload) -> int:
    if upload.state == FINISHED:
        return upload.size
    try:
        return partial_path(store, upload.id).stat().st_size
    except FileNotFoundError:
        return 0


def view(store: ArtifactStore, upload: Upload) -> UploadView:
    return UploadView(
        id=upload.id,
        filename=upload.filename,
        size=upload.size,
        offset=offset_of(store, upload),
        state=upload.state,
        sha256=upload.sha256,
        created_by=upload.created_by,
    )


def create_upload(
    session: Session, request: UploadCreate, by: str, store: ArtifactStore, settings: Settings
) -> Upload:
    if request.size > settings.max_upload_bytes:
        raise TooLarge(
            f"size: {request.filename} has {request.size} bytes, over this server's limit of "
            f"{settings.max_upload_bytes} per file (DECODEBENCH_MAX_UPLOAD_BYTES)"
        )
    upload = Upload(
        id=secrets.token_hex(16),
        filename=request.filename,
        size=request.size,
        state=OPEN,
        created_by=by,
        project_id=tenancy.owner(session),
    )
    session.add(upload)
    session.flush()
    path = partial_path(store, upload.id)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()
    return upload


def get_upload(session: Session, upload_id: str, by: str, *, lock: bool = False) -> Upload:
    """The caller's upload (someone else's is not found)."""
    statement = select(Upload).where(
        Upload.id == upload_id, Upload.created_by == by, tenancy.uploads(session)
    )
    upload = session.scalar(statement.with_for_update() if lock else statement)
    if upload is None:
        raise NotFound(f"no upload {upload_id}")
    return upload


@contextlib.contextmanager
def _writer(path: Path, upload_id: str) -> Iterator[BinaryIO]:
    """The partial file, opened for writing under its lock (409 while another holds it)."""
    try:
        handle = path.open("r+b")
    except FileNotFoundError:
        raise NotFound(f"upload {upload_id} has no bytes on this server any more") from None
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise Conflict(
                f"upload {upload_id}: another request is writing it; retry once it is done"
            ) from None
        yield handle


async def write_chunk(
    store: ArtifactStore, upload_id: str, size: int, offset: int, chunks: AsyncIterator[bytes]
) -> int:
    """Append the body at ``offset`` (which must be the current offset); the new offset. Bytes
    that arrived before a connection was cut stay: the client resumes after them."""
    with _writer(partial_path(store, upload_id), upload_id) as handle:
        current = os.fstat(handle.fileno()).st_size
        if offset != current:
            raise Conflict(
                f"offset: upload {upload_id} is at byte {current}, not {offset}; "
                "send from the current offset (GET the upload)"
            )
        handle.seek(current)
        written = current
        try:
            async for chunk in chunks:
                if written + len(chunk) > size:
                    handle.write(chunk[: size - written])
                    raise TooLarge(
                        f"the chunk runs past the upload's declared size of {size} bytes"
                    )
                handle.write(chunk)
                written += len(chunk)
        finally:
            handle.flush()
            os.fsync(handle.fileno())
        return written


def finish_upload(
    session: Session, upload_id: str, sha256: str, by: str, store: ArtifactStore
) -> Upload:
    upload = get_upload(session, upload_id, by, lock=True)
    if upload.state == FINISHED:
        if upload.sha256 != sha256:
            raise Conflict(f"upload {upload_id} was finished with sha256 {upload.sha256}")
        return upload  # the same finish again: its answer was lost
    path = partial_path(store, upload_id)
    if not path.exists() and store.exists(sha256):
        return _finished(upload, sha256)  # moved, then the commit was lost: finish it now
    with _writer(path, upload_id) as handle:
        received = os.fstat(handle.fileno()).st_size
        if received != upload.size:
            raise Conflict(
                f"upload {upload_id} has {received} of its {upload.size} bytes; send the rest "
                "before finishing"
            )
        digest = hashlib.sha256()
        handle.seek(0)
        while chunk := handle.read(_HASH_CHUNK):
            digest.update(chunk)
        if digest.hexdigest() != sha256:
            handle.truncate(0)
            raise InvalidInput(
                f"sha256: the {received} bytes received hash to {digest.hexdigest()}, not "
                f"{sha256}; the upload is reset to offset 0, send the file again"
            )
        final = store.path_for(sha256)
        final.parent.mkdir(parents=True, exist_ok=True)
        if final.is_file():
            path.unlink()
        else:
            os.replace(path, final)
    return _finished(upload, sha256)


def _finished(upload: Upload, sha256: str) -> Upload:
    upload.state = FINISHED
    upload.sha256 = sha256
    upload.updated_at = datetime.now(UTC)
    return upload


def prune_uploads(session: Session, store: ArtifactStore, idle_seconds: float) -> int:
    """Forget open uploads nobody has written to for ``idle_seconds`` (their partial bytes and
    their row); one being written now is left alone. Returns how many were pruned."""
    now = time.time()
    pruned = 0
    candidates = session.scalars(
        select(Upload).where(Upload.state == OPEN).with_for_update(skip_locked=True)
    ).all()
    for upload in candidates:
        path = partial_path(store, upload.id)
        try:
            handle = path.open("r+b")
        except FileNotFoundError:
            session.delete(upload)
            pruned += 1
            continue
        with handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue
            if now - os.fstat(handle.fileno()).st_mtime < idle_seconds:
                continue
            path.unlink()
        session.delete(upload)
        pruned += 1
    return pruned
