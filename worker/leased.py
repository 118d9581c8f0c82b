"""The one loop of leased work, a build's or a doctor job's: read the assignment, start under a
lease, run the kind's handler while a thread keeps the lease (progress and bare renewals), then
deliver the outcome, or fail the work saying why. A kind supplies only a :class:`LeasedKind`:
which of the client's leased calls are its own, and its handler.

The work never waits on the network while it runs: progress goes to the server from the lease
thread, which keeps trying while the server is away. A finished piece of work delivers its
outcome for up to ``report_patience_s``; a server that gave the work to another worker
meanwhile refuses it (409), and that is the outcome."""

from __future__ import annotations

import logging
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import httpx

from decodebench.client import ApiError, DecodebenchClient, LeasedWork
from decodebench.contracts.base import Contract
from worker.config import WorkerSettings

log = logging.getLogger(__name__)
_T = TypeVar("_T")
A = TypeVar("A", bound=Contract)

PROGRESS_INTERVAL_S = 1.0
RETRY_PAUSE_S = (1.0, 2.0, 5.0, 10.0)  # between deliveries to a server that is away
DEFAULT_LEASE_S = 120.0  # should a server not say


class LeaseLost(Exception):
    """The server gave the work to someone else (its lease ran out) or it was abandoned."""


class WorkError(Exception):
    """The work cannot be done as asked: its message is the reason the work fails with."""


class Refused(WorkError):
    """The work is not this worker's to do (e.g. another toolchain): failed, and said so."""


@dataclass(frozen=True)
class Held(Generic[A]):
    """What a handler is given: the work's assignment, the lease it holds, a scratch folder
    (removed afterwards) and ``progress(stage, fraction)``, which raises LeaseLost once the
    server has refused the lease."""

    client: DecodebenchClient
    settings: WorkerSettings
    work_id: int
    assignment: A
    lease: str
    tmp: Path
    progress: Callable[[str, float], None]


@dataclass(frozen=True)
class LeasedKind(Generic[A]):
    """``calls`` picks the kind's leased calls from a client; ``handle`` does the work and
    returns its outcome (carrying the lease) and what to say of it ("built <sha256>");
    ``fail_refused_completion``: a completion refused as invalid (422) fails the work instead of
    leaving it to be taken again once the lease runs out."""

    noun: str  # "build", "doctor job"
    calls: Callable[[DecodebenchClient], LeasedWork[A]]
    handle: Callable[[Held[A]], tuple[Contract, str]]
    fail_refused_completion: bool = False


def run_leased(kind: LeasedKind[A], work_id: int, settings: WorkerSettings) -> str:
    """Returns what happened, for the task's result and the log."""
    with DecodebenchClient(settings.server_url, settings.token) as client:
        calls = kind.calls(client)
        assignment = calls.assignment(work_id)
        start = calls.start(work_id, settings.name)
        if not start.proceed or start.lease is None:
            return f"skipped: {kind.noun} is {start.state}"
        lease = start.lease
        seconds = start.lease_seconds or DEFAULT_LEASE_S
        renewal = LeaseRenewal(settings, kind, work_id, lease, seconds)
        settings.work_dir.mkdir(parents=True, exist_ok=True)
        prefix = f"{kind.noun.replace(' ', '-')}-{work_id}-"
        with tempfile.TemporaryDirectory(dir=settings.work_dir, prefix=prefix) as tmp:
            held = Held(client, settings, work_id, assignment, lease, Path(tmp), renewal.progress)
            try:
                outcome, done = kind.handle(held)
            except LeaseLost as error:
                renewal.stop()
                log.warning("%s %s: stopped, %s", kind.noun, work_id, error)
                return f"refused: {error}"
            except Exception as error:
                renewal.stop()
                if not isinstance(error, Refused):
                    log.exception("%s %s failed", kind.noun, work_id)
                reason = str(error) if isinstance(error, WorkError) else _reason(error)
                calls.fail(work_id, lease, reason)
                return f"{'refused' if isinstance(error, Refused) else 'failed'}: {error}"
            renewal.stop()
            return _complete(kind, calls, held, outcome, done)


def _reason(error: Exception) -> str:
    return f"{type(error).__name__}: {error}"


def _complete(
    kind: LeasedKind[A], calls: LeasedWork[A], held: Held[A], outcome: Contract, done: str
) -> str:
    what = f"{kind.noun} {held.work_id}"
    try:
        delivered(lambda: calls.complete(held.work_id, outcome), held.settings, f"{what} report")
    except ApiError as error:
        if error.status_code == 409:
            log.warning("%s: completion refused, done elsewhere: %s", what, error)
            return f"refused: {error}"
        if error.status_code == 422 and kind.fail_refused_completion:
            calls.fail(held.work_id, held.lease, f"completion refused: {error.detail}")
            return f"failed: {error}"
        raise
    return done


def away(error: Exception) -> bool:
    """The server is unreachable or its database is (503): worth trying again."""
    return isinstance(error, httpx.TransportError) or (
        isinstance(error, ApiError) and error.status_code == 503
    )


def delivered(send: Callable[[], _T], settings: WorkerSettings, what: str) -> _T:
    """``send()``'s answer, tried again while the server is away, for up to
    ``report_patience_s``."""
    deadline = time.monotonic() + settings.report_patience_s
    attempt = 0
    while True:
        try:
            return send()
        except (httpx.TransportError, ApiError) as error:
            if not away(error) or time.monotonic() > deadline:
                raise
            pause = RETRY_PAUSE_S[min(attempt, len(RETRY_PAUSE_S) - 1)]
            log.warning("%s: the server is away (%s); trying again in %g s", what, error, pause)
            attempt += 1
            time.sleep(pause)


class LeaseRenewal:
    """Holds the work's lease from a thread while it runs: it sends the latest progress (which
    renews the lease) at most every second, or a bare renewal every third of the lease, so a
    stage of any length keeps it and never waits on the network. A killed worker stops renewing
    and the server queues the work again once the lease runs out; a worker cut off from the
    server keeps working, and learns on its next report whether the work is still its own."""

    def __init__(
        self,
        settings: WorkerSettings,
        kind: LeasedKind[Any],
        work_id: int,
        lease: str,
        seconds: float,
    ) -> None:
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self._latest: tuple[str, float] | None = None
        self.lost: ApiError | None = None
        self._thread = threading.Thread(
            target=self._renew,
            args=(settings, kind, work_id, lease, max(seconds / 3, 0.5)),
            name=f"lease-{work_id}",
            daemon=True,
        )
        self._thread.start()

    def progress(self, stage: str, fraction: float) -> None:
        """Note the work's progress for the next report; raises LeaseLost once the server has
        refused the lease, so work someone else now holds stops."""
        if self.lost is not None:
            raise LeaseLost(f"lease refused: {self.lost}")
        with self._lock:
            self._latest = (stage, max(0.0, min(1.0, fraction)))

    def _renew(
        self,
        settings: WorkerSettings,
        kind: LeasedKind[Any],
        work_id: int,
        lease: str,
        every: float,
    ) -> None:
        last_renewal = time.monotonic()
        what = f"{kind.noun} {work_id}"
        with DecodebenchClient(settings.server_url, settings.token) as client:
            calls = kind.calls(client)
            while not self._stopped.wait(min(PROGRESS_INTERVAL_S, every)):
                with self._lock:
                    latest, self._latest = self._latest, None
                if latest is None and time.monotonic() - last_renewal < every:
                    continue
                try:
                    if latest is not None:
                        calls.progress(work_id, lease, *latest)
                    else:
                        calls.renew(work_id, lease)
                    last_renewal = time.monotonic()
                except ApiError as error:
                    if error.status_code == 409:  # taken over or abandoned: stop
                        log.warning("%s: lease refused: %s", what, error)
                        self.lost = error
                        return
                    log.warning("%s: lease renewal failed: %s", what, error)
                except httpx.TransportError as error:  # the server is away: try again
                    log.warning("%s: lease renewal failed: %s", what, error)

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=5)
