"""What every part of the client shares: the API's prefix, the keep-alive, the error a failed
call raises, reading an answer, and a file's content address."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

API = "/api/v1"
# How long an idle connection is kept for the next request: longer than a typical run (httpx's
# 5 s default made every claim and upload after a 5 s run open a new connection), shorter than
# the server's keep-alive (30 s, server/serving.py), so it is never closed under a request.
KEEPALIVE_S = 20.0

# One call to the server: method, path below API, httpx's keyword arguments; the answer's JSON.
Request = Callable[..., Any]


class ApiError(Exception):
    """The server answered with an error status; `detail` is its message."""

    def __init__(self, status_code: int, detail: Any) -> None:
        self.status_code = status_code
        self.detail = detail
        super().__init__(f"HTTP {status_code}: {detail}")


def answer(response: httpx.Response) -> Any:
    """The response's JSON; raises ApiError with the server's detail for an error status."""
    if response.status_code >= 400:
        try:
            detail = response.json().get("detail", response.text)
        except ValueError:
            detail = response.text
        raise ApiError(response.status_code, detail)
    if response.status_code == 204 or not response.content:
        return None
    return response.json()


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for chunk in iter(lambda: stream.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
