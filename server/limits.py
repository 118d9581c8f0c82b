"""Request-body size limits, enforced while the body streams in.

A body that declares a larger Content-Length is refused before a byte of it is read; one that
streams past the limit is cut off at the limit (the handler reading it gets the 413), so neither
a huge JSON document is parsed nor a huge artifact written to disk in full."""

from __future__ import annotations

import json

from fastapi import FastAPI, HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.config import get_settings

ARTIFACT_PREFIX = "/api/v1/artifacts/"


class BodyTooLarge(HTTPException):
    """An HTTPException, so FastAPI's body reading passes it on as the 413 it is."""

    def __init__(self, limit: int, what: str) -> None:
        super().__init__(
            status_code=413,
            detail=f"{what} exceeds this server's limit of {limit} bytes "
            f"(DECODEBENCH_MAX_{'ARTIFACT' if what == 'artifact' else 'BODY'}_BYTES)",
        )


def _limit_for(scope: Scope) -> tuple[int, str]:
    settings = get_settings()
    if scope["method"] == "PUT" and scope["path"].startswith(ARTIFACT_PREFIX):
        return settings.max_artifact_bytes, "artifact"
    return settings.max_body_bytes, "request body"


class BodyLimit:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit, what = _limit_for(scope)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await _refuse(send, BodyTooLarge(limit, what))
            return
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise BodyTooLarge(limit, what)
            return message

        await self.app(scope, counted, send)


async def _refuse(send: Send, error: BodyTooLarge) -> None:
    body = json.dumps({"detail": error.detail}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def install_body_limit(app: FastAPI) -> None:
    app.add_middleware(BodyLimit)
