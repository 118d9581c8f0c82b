"""Wake long-poll claims the moment a run of their device class becomes claimable.

Each server process keeps one PostgreSQL connection LISTENing on `decodebench_runs`, which a
trigger on `runs` notifies (on commit) with `<device class> <run id>` for every run that
becomes queued (migration 0006): a sweep submitted with ready builds, a build finishing, a run
retried or whose lease ran out, whatever the code path. A waiting claim is an asyncio future:
it holds neither a database connection nor a thread while it waits.

One notification wakes one waiting claim of its class in each process (the oldest), so a
queue of 400 runs wakes up to 400 idle devices and a single run a handful, not the whole fleet.
Nothing here is state the server depends on: a notification that finds no waiter is dropped
(the devices are busy and will claim when they finish), and when the listener is down waiting
claims fall back to polling every `claim_fallback_poll_s`.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict, deque
from collections.abc import Mapping

import psycopg
from psycopg.conninfo import make_conninfo
from sqlalchemy.engine import make_url

CHANNEL = "decodebench_runs"
RECONNECT_DELAY_S = 1.0
MAX_RECONNECT_DELAY_S = 15.0

log = logging.getLogger(__name__)


def psycopg_conninfo(database_url: str) -> str:
    """SQLAlchemy's URL (postgresql+psycopg://…) as libpq's."""
    return make_url(database_url).set(drivername="postgresql").render_as_string(hide_password=False)


class ClaimWakeups:
    def __init__(self, conninfo: str) -> None:
        self._conninfo = conninfo
        self._waiters: dict[str, deque[asyncio.Future[object]]] = defaultdict(deque)
        # Notifications counted per class, so a claim can tell one arrived while it was
        # looking at the queue (before it waited) and look again instead of missing it.
        self.received = 0
        self._last_for_class: dict[str, int] = {}
        self.listening = False
        self._task: asyncio.Task[None] | None = None
        self.loop = asyncio.get_running_loop()

    def ensure_listening(self) -> None:
        if self._task is None or self._task.done():
            self._task = self.loop.create_task(self._listen(), name="claim-wakeups")

    def notified_since(self, device_class: str, mark: int) -> bool:
        return self._last_for_class.get(device_class, -1) > mark

    def wait_for(self, device_class: str) -> asyncio.Future[object]:
        future: asyncio.Future[object] = self.loop.create_future()
        self._waiters[device_class].append(future)
        return future

    def forget(self, device_class: str, future: asyncio.Future[object]) -> None:
        waiters = self._waiters.get(device_class)
        if waiters is not None:
            try:
                waiters.remove(future)
            except ValueError:
                pass  # already woken
            if not waiters:
                self._waiters.pop(device_class, None)

    def _wake_one(self, device_class: str) -> None:
        self.received += 1
        self._last_for_class[device_class] = self.received
        waiters = self._waiters.get(device_class)
        while waiters:
            future = waiters.popleft()
            if not future.done():
                future.set_result(None)
                break
        if waiters is not None and not waiters:
            self._waiters.pop(device_class, None)

    def _wake_all(self) -> None:
        for waiters in self._waiters.values():
            for future in waiters:
                if not future.done():
                    future.set_result(None)
        self._waiters.clear()

    async def _listen(self) -> None:
        delay_s = RECONNECT_DELAY_S
        while True:
            try:
                connection = await psycopg.AsyncConnection.connect(self._conninfo, autocommit=True)
                async with connection:
                    await connection.execute(f"LISTEN {CHANNEL}")
                    self.listening = True
                    delay_s = RECONNECT_DELAY_S
                    # Whatever became claimable while nobody listened: let every claim look.
                    self._wake_all()
                    async for notification in connection.notifies():
                        device_class, _, _ = notification.payload.rpartition(" ")
                        self._wake_one(device_class)
            except asyncio.CancelledError:
                self.listening = False
                raise
            except Exception as error:  # noqa: BLE001 - any failure: reconnect, poll meanwhile
                log.warning("claim wake-ups: listener lost (%r); reconnecting", error)
            self.listening = False
            await asyncio.sleep(delay_s)
            delay_s = min(delay_s * 2, MAX_RECONNECT_DELAY_S)


_wakeups: ClaimWakeups | None = None


def claim_wakeups(database_url: str, timeouts: Mapping[str, int]) -> ClaimWakeups:
    """This process's (and this event loop's) listener, started on first use."""
    global _wakeups
    loop = asyncio.get_running_loop()
    if _wakeups is None or _wakeups.loop is not loop:
        # with keepalives a listener whose link was cut notices, and reconnects once it is back
        _wakeups = ClaimWakeups(make_conninfo(psycopg_conninfo(database_url), **timeouts))
    _wakeups.ensure_listening()
    return _wakeups
