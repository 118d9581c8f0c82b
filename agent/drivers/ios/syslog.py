"""The device log lines of the harness process, captured for a run's failure reason."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from pymobiledevice3.lockdown import LockdownClient
from pymobiledevice3.services.syslog import SyslogService

from decodebench.harness import HARNESS_PROCESS_NAME

CHUNK = 4096
LINE_END = b"\n\x00"
KEEP_LINES = 1000


async def syslog_lines(service: SyslogService) -> AsyncIterator[str]:
    """The relay's lines (each ends in "\\n\\0"). pymobiledevice3 11.45's `SyslogService.watch`
    yields a chunk's lines again when the chunk ends exactly on a line end (its buffer is not
    cleared), so this splits the stream itself."""
    buffer = b""
    while True:
        chunk = await service.service.recv_any(CHUNK)
        if not chunk:
            return
        buffer += chunk
        *lines, buffer = buffer.split(LINE_END)
        for line in lines:
            if line:
                yield line.decode(errors="replace")


async def capture_harness_lines(
    open_lockdown: Callable[[], contextlib.AbstractAsyncContextManager[LockdownClient]],
    lines: list[str],
    subscribed: asyncio.Event,
) -> None:
    """Append the harness's lines to `lines` until cancelled; `subscribed` once listening."""
    async with open_lockdown() as lockdown:
        service = SyslogService(lockdown)
        await service.connect()
        subscribed.set()
        try:
            async for line in syslog_lines(service):
                if HARNESS_PROCESS_NAME in line:
                    lines.append(line)
                    del lines[:-KEEP_LINES]
        finally:
            await service.close()


async def start_capture(
    open_lockdown: Callable[[], contextlib.AbstractAsyncContextManager[LockdownClient]],
    lines: list[str],
) -> tuple[asyncio.Task[Any], str | None]:
    """The capture task, once it listens (or has failed: then the reason, for the log)."""
    subscribed = asyncio.Event()
    task = asyncio.ensure_future(capture_harness_lines(open_lockdown, lines, subscribed))
    waiter = asyncio.ensure_future(subscribed.wait())
    await asyncio.wait({task, waiter}, timeout=5, return_when=asyncio.FIRST_COMPLETED)
    waiter.cancel()
    if task.done() and task.exception() is not None:
        return task, repr(task.exception())
    return task, None
