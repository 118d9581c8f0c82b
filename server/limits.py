"""Limits on what one server process takes on: request-body sizes, enforced while the body
streams in, and requests in progress.

A body that declares a larger Content-Length is refused before a byte of it is read; one that
streams past the limit is cut off at the limit (the handler reading it gets the 413), so neither
a huge JSON document is parsed nor a huge artifact written to disk in full."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, HTTPException
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.config import get_settings

ARTIFACT_PREFIX = "/api/v1/artifacts/"
UPLOAD_PREFIX = "/api/v1/uploads/"


class BodyTooLarge(HTTPException):
    """An HTTPException, so FastAPI's body reading passes it on as the 413 it is."""

    def __init__(self, limit: int, what: str) -> None:
        super().__init__(
            status_code=413,
            detail=f"{what} exceeds this server's limit of {limit} bytes "
            f"(DECODEBENCH_MAX_{_SETTING.get(what, 'BODY')}_BYTES)",
        )


_SETTING = {"artifact": "ARTIFACT", "upload chunk": "UPLOAD_CHUNK"}


def _limit_for(scope: Scope) -> tuple[int, str]:
    settings = get_settings()
    if scope["method"] == "PUT" and scope["path"].startswith(ARTIFACT_PREFIX):
        return settings.max_artifact_bytes, "artifact"
    if scope["method"] == "PUT" and scope["path"].startswith(UPLOAD_PREFIX):
        return settings.max_upload_chunk_bytes, "upload chunk"
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
    await _send_json(send, 413, {"detail": error.detail}, [(b"connection", b"close")])


async def _send_json(
    send: Send, status: int, content: dict, headers: list[tuple[bytes, bytes]]
) -> None:
    body = json.dumps(content).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class Admission:
    """At most as many requests in progress as the process has database connections.

    A request takes a connection in one thread (its token lookup) and needs another thread later
    (its handler); with more requests in flight than connections, threads blocked waiting for a
    connection starve the requests that hold one, and the process freezes until the pool times
    out. Admitted requests always find a connection; the others wait here, on the event loop,
    and after the pool timeout are told 503 with Retry-After. Health probes are not counted,
    and a long-poll claim admits itself for each look at the queue (`admitted`), not for the
    time it waits."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope["path"] in UNCOUNTED
            or scope["path"] in SELF_ADMITTED
            or scope["path"].startswith("/static/")
        ):
            await self.app(scope, receive, send)
            return
        try:
            async with admitted():
                await self.app(scope, receive, send)
        except ServerBusy:
            await _busy(send, get_settings().retry_after_s)


UNCOUNTED = frozenset({"/api/v1/health"})
SELF_ADMITTED = frozenset({"/api/v1/agents/claim", "/api/v1/agents/claims"})


class ServerBusy(Exception):
    """No admission within the pool timeout."""


class _Slots:
    """One process's admission slots, and the share of them claims may hold."""

    def __init__(self, total: int) -> None:
        self.loop = asyncio.get_running_loop()
        self.all = asyncio.Semaphore(total)
        self.claims = asyncio.Semaphore(claim_share(total))


def claim_share(total: int) -> int:
    """How many of ``total`` slots looks at the queue may hold at once: all but a quarter (at
    least one), so a thousand devices woken together cannot keep a build's completion, a
    result upload or a heartbeat waiting behind their claims until it is told 503."""
    return max(1, total - max(1, total // 4))


_slots: _Slots | None = None


@asynccontextmanager
async def admitted(*, claim_wait_s: float | None = None) -> AsyncIterator[None]:
    """Hold one of the process's admission slots (one per database connection); raises
    `ServerBusy` when none frees up within the pool timeout.

    A look at the queue (``claim_wait_s`` given) first waits for the claims' share of the slots,
    then for a slot, for up to ``claim_wait_s`` in all (what is left of its long poll, at least
    the pool timeout): it holds nothing meanwhile but its place in line, and a device that would
    otherwise be told 503 and come back later waits its turn instead."""
    global _slots
    settings = get_settings()
    if _slots is None or _slots.loop is not asyncio.get_running_loop():
        _slots = _Slots(settings.db_pool_size + settings.db_max_overflow)
    slots = _slots
    share = None
    wait_s = settings.db_pool_timeout_s
    if claim_wait_s is not None:
        share = slots.claims
        started = slots.loop.time()
        try:
            await asyncio.wait_for(share.acquire(), max(claim_wait_s, wait_s))
        except TimeoutError:
            raise ServerBusy from None
        wait_s = max(claim_wait_s - (slots.loop.time() - started), wait_s)
    try:
        try:
            await asyncio.wait_for(slots.all.acquire(), wait_s)
        except TimeoutError:
            raise ServerBusy from None
        try:
            yield
        finally:
            slots.all.release()
    finally:
        if share is not None:
            share.release()


def busy_response() -> JSONResponse:
    retry_after = get_settings().retry_after_s
    return JSONResponse(
        {"detail": f"server busy: every database connection is in use; retry in {retry_after} s"},
        status_code=503,
        headers={"Retry-After": str(retry_after)},
    )


async def _busy(send: Send, retry_after: int) -> None:
    await _send_json(
        send,
        503,
        {"detail": f"server busy: every database connection is in use; retry in {retry_after} s"},
        [(b"retry-after", str(retry_after).encode())],
    )


def install_limits(app: FastAPI) -> None:
    app.add_middleware(BodyLimit)
    app.add_middleware(Admission)
