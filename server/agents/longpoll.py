"""Long-poll claims: look at the queue, and between looks wait to be woken, holding nothing.

A claim with `wait_seconds` is answered the moment a run of one of its devices' classes becomes
claimable. Each look at the queue is a short transaction in a worker thread, admitted for its
duration only (server/limits.py); between looks the request only awaits a notification
(server/agents/wakeup.py), holding neither a database connection nor a thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import contextmanager
from typing import TypeVar

from fastapi import Request
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from server.agents.service import agent_for_token
from server.agents.wakeup import claim_wakeups
from server.auth import authenticated
from server.config import Settings, get_settings
from server.db import session_scope
from server.errors import Forbidden
from server.limits import ServerBusy, admitted
from server.models import TokenKind
from server.runs.service import expire_leases

_Found = TypeVar("_Found")
# One look for the request's agent: what it found, and the device classes still waiting.
Look = Callable[[Session, int, Settings], tuple[_Found, set[str]]]


async def claim_for_agent(
    request: Request, wait_seconds: int, look: Look[_Found], nothing: _Found
) -> _Found:
    """``look`` for the request's agent, each time in a transaction of its own, until it finds
    something (a falsy find is ``nothing`` found), the client goes away, or ``wait_seconds``
    have passed; ``nothing`` when none came. Raises ServerBusy when a first look without
    waiting finds no slot."""
    return await _long_poll(
        request, wait_seconds, lambda: _in_agent_transaction(request, look), nothing
    )


async def _long_poll(
    request: Request,
    wait_seconds: int,
    look: Callable[[], tuple[_Found, set[str]]],
    nothing: _Found,
) -> _Found:
    """Look at the queue (``look``: what it found, and the device classes still waiting) until
    it finds something, the client goes away, or ``wait_seconds`` have passed; between looks
    await a wake-up of one of the waiting classes."""
    settings = get_settings()
    if wait_seconds == 0:
        found, _ = await _look(look, 0.0)
        return found
    wakeups = claim_wakeups(settings.database_url, settings.libpq_timeouts)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_seconds
    # The body has been read: the next message is the client going away. A claim nobody
    # waits for any more ends there (its agent stopped, or gave up and will claim anew).
    gone: asyncio.Future[object] = asyncio.ensure_future(request.receive())
    try:
        while True:
            mark = wakeups.received
            try:
                found, classes = await _look(look, deadline - loop.time())
            except ServerBusy:
                # It waited its turn to the end of its long poll (a look is never refused
                # sooner): answered as any long poll at its deadline, and claimed again at once.
                return nothing
            remaining_s = deadline - loop.time()
            if found or remaining_s <= 0 or gone.done() or not classes:
                return found
            if any(wakeups.notified_since(device_class, mark) for device_class in classes):
                continue  # a run became claimable while we looked: look again
            woken = {device_class: wakeups.wait_for(device_class) for device_class in classes}
            poll_s = remaining_s if wakeups.listening else settings.claim_fallback_poll_s
            try:
                awaited: set[asyncio.Future[object]] = {*woken.values(), gone}
                await asyncio.wait(
                    awaited, timeout=min(remaining_s, poll_s), return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                for device_class, future in woken.items():
                    wakeups.forget(device_class, future)
            any_woken = any(future.done() for future in woken.values())
            if gone.done() or (loop.time() >= deadline and not any_woken):
                return nothing
    finally:
        gone.cancel()


async def _look(
    look: Callable[[], tuple[_Found, set[str]]], wait_s: float
) -> tuple[_Found, set[str]]:
    """One look, admitted for its duration only, within the claims' share of the slots
    (server/limits.py); it may wait for that share for up to ``wait_s``."""
    async with admitted(claim_wait_s=wait_s):
        return await run_in_threadpool(look)


def _in_agent_transaction(request: Request, look: Look[_Found]) -> tuple[_Found, set[str]]:
    """``look`` for the request's agent in one transaction (its token checked in it too), with
    the leases that ran out given back to the queue first."""
    settings = get_settings()
    with contextmanager(session_scope)() as session:
        token = authenticated(request, session)
        if token.kind != TokenKind.agent.value:
            raise Forbidden(f"this endpoint needs a agent token, not a {token.kind} token")
        agent = agent_for_token(session, token)
        expire_leases(session, settings.max_run_attempts)
        return look(session, agent.id, settings)
