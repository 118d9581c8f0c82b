"""Files through the uploads API (chunks at offsets, then finish with the sha256) and their
registration as a model, as a client does it."""

from __future__ import annotations

import hashlib

from tests.support.api import bearer


def send(api, token: str, name: str, data: bytes, chunk: int = 1 << 18) -> str:
    """Upload ``data`` in chunks and finish it; its sha256."""
    headers = bearer(token)
    created = api.post(
        "/api/v1/uploads", json={"filename": name, "size": len(data)}, headers=headers
    )
    assert created.status_code == 201, created.text
    upload = created.json()["id"]
    for offset in range(0, len(data), chunk):
        put = api.put(
            f"/api/v1/uploads/{upload}",
            params={"offset": offset},
            content=data[offset : offset + chunk],
            headers=headers,
        )
        assert put.status_code == 200, put.text
    sha256 = hashlib.sha256(data).hexdigest()
    finished = api.post(
        f"/api/v1/uploads/{upload}/finish", json={"sha256": sha256}, headers=headers
    )
    assert finished.status_code == 200, finished.text
    return sha256


def register(api, token: str, name: str, files: dict[str, bytes]):
    """Upload the files (each time: a model's files must be its own project's uploads, and the
    tables are emptied between tests) and register them as ``name``."""
    refs = [{"path": path, "sha256": send(api, token, path, data)} for path, data in files.items()]
    return api.post("/api/v1/models", json={"name": name, "files": refs}, headers=bearer(token))
