"""Finished runs' results, kept on disk until the server has them.

A run's results are written to the outbox (atomically: a temporary file, fsync'd, renamed, the
directory fsync'd) before the first upload is tried, so neither a server outage of any length
nor an agent restart loses a finished run. Each run's entry goes up at once, in one request with
the other devices' entries finishing at that moment (`BatchedUploads`: one agent serves many
devices); its run holds it meanwhile. The backlog left by an outage or a previous process is
delivered oldest first, by whichever device is about to claim, each entry by one thread at a
time. Every upload goes up as a batch (`POST /agents/results`), a backlog entry as a batch of
one. Uploads are idempotent per (run, prompt) on the server, so delivering one twice would
still store it once.
An entry leaves the outbox once the server stored it, or refused it for good (a 4xx: the run
was claimed again by another device, or has ended): retrying could not change that answer.
"""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path

import httpx

from decodebench.client import ApiError
from decodebench.contracts.protocol import MAX_BATCH_RESULTS, ResultsBatchStored
from decodebench.contracts.results import RunResult

log = logging.getLogger(__name__)
ENTRY = re.compile(r"^(\d{12})-run-(\d+)\.json\Z")
MAX_BACKOFF_S = 10.0
# Uploads gathered into one request: whatever finished within GATHER_S of the first, up to
# MAX_BATCH_RESULTS runs or a quarter of the server's default body limit (4 MiB).
GATHER_S = 0.02
MAX_BATCH_BYTES = 1 << 20


class Outbox:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.directory.mkdir(parents=True, exist_ok=True)
        self._write_lock = threading.Lock()
        self._flight_lock = threading.Lock()
        self._in_flight: set[Path] = set()  # entries some thread is delivering now
        self._sequence = max((_sequence(path) for path in self.pending()), default=0)
        # Entries the server refused for good, with its answer, for the run's executor to report.
        self.refused: dict[Path, ApiError] = {}

    def put(self, run_id: int, result: RunResult, hold: bool = False) -> Path:
        """Store ``result`` durably; returns its entry. With ``hold`` the entry is the caller's
        to deliver (as `take` would make it) from the moment it exists, so a device delivering
        the backlog does not send it alone while its run hands it to a batch; the caller
        `release`s it."""
        payload = json.dumps({"run_id": run_id, "result": result.model_dump(mode="json")})
        with self._write_lock:  # only the number: devices write their entries concurrently
            self._sequence += 1
            sequence = self._sequence
        final = self.directory / f"{sequence:012d}-run-{run_id}.json"
        if hold:
            self.take(final)
        handle, temporary = tempfile.mkstemp(dir=self.directory, prefix=".entry-")
        try:
            with os.fdopen(handle, "w") as out:
                out.write(payload)
                out.flush()
                os.fsync(out.fileno())
            os.replace(temporary, final)
        finally:
            if os.path.exists(temporary):
                os.unlink(temporary)
        _fsync_directory(self.directory)
        return final

    def pending(self) -> list[Path]:
        return sorted(p for p in self.directory.iterdir() if ENTRY.match(p.name))

    def deliver(
        self,
        send: Callable[[Sequence[str]], ResultsBatchStored],
        stop: threading.Event,
        until: Path | None = None,
    ) -> bool:
        """Deliver ``until`` alone, or else every entry nobody else is delivering (oldest
        first), each as a batch of one (``send``: the batched upload), retrying while the server is unreachable or failing, until done or ``stop`` is
        set. True when done."""
        backoff_s = 1.0
        while not stop.is_set():
            if until is not None:
                if not until.exists():
                    return True
                entry = until
            else:
                with self._flight_lock:
                    waiting = [path for path in self.pending() if path not in self._in_flight]
                if not waiting:
                    return True
                entry = waiting[0]
            if not self.take(entry):
                stop.wait(0.05)  # another thread is delivering it; see how that ends
                continue
            try:
                if entry.exists():
                    self._deliver_one(entry, send)
                backoff_s = 1.0
            except (httpx.TransportError, ApiError) as error:
                log.warning(
                    "outbox: %s not delivered (%s); retrying in %.0f s",
                    entry.name,
                    error,
                    backoff_s,
                )
                stop.wait(backoff_s)
                backoff_s = min(MAX_BACKOFF_S, backoff_s * 2)
            finally:
                with self._flight_lock:
                    self._in_flight.discard(entry)
        return False

    def take(self, entry: Path) -> bool:
        """Mark ``entry`` as being delivered by the caller; False when another is at it."""
        with self._flight_lock:
            if entry in self._in_flight:
                return False
            self._in_flight.add(entry)
            return True

    def release(self, entry: Path) -> None:
        with self._flight_lock:
            self._in_flight.discard(entry)

    def _deliver_one(
        self, entry: Path, send: Callable[[Sequence[str]], ResultsBatchStored]
    ) -> None:
        try:
            text = entry.read_text()
            stored = json.loads(text)
            run_id = int(stored["run_id"])
            RunResult.model_validate(stored["result"])
        except (ValueError, KeyError, TypeError) as error:  # not ours to guess: keep it aside
            log.error("outbox: %s is unreadable (%s); set aside as .unreadable", entry.name, error)
            entry.rename(entry.with_name(entry.name + ".unreadable"))
            return
        refusal: ApiError | None
        try:
            outcomes = {outcome.run_id: outcome for outcome in send([text]).outcomes}
        except ApiError as error:
            if error.status_code >= 500 or error.status_code == 429:
                raise
            refusal = error  # the batch of one refused whole: this entry refused
        else:
            outcome = outcomes.get(run_id)
            if outcome is None:
                raise ApiError(502, f"the server's answer has no outcome for run {run_id}")
            refusal = None if outcome.status == 200 else ApiError(outcome.status, outcome.detail)
        self.settled(entry, run_id, refusal)
        _fsync_directory(self.directory)

    def settled(self, entry: Path, run_id: int, refusal: ApiError | None) -> None:
        """The server has ``entry`` (``refusal`` None) or refused it for good: it leaves the
        outbox, a refusal kept for its run's executor. The caller fsyncs the directory."""
        if refusal is None:
            log.info("outbox: delivered the results of run %d", run_id)
        else:
            log.error(
                "outbox: the server refused the results of run %d for good: %s", run_id, refusal
            )
            self.refused[entry] = refusal
        entry.unlink(missing_ok=True)


class BatchedUploads:
    """Finished runs of all of an agent's devices go up together: a thread gathers the entries
    that runs hand it (`deliver`) into one `POST /agents/results` each, and answers each run
    with its own outcome. The entries are read as stored and sent as they are. A batch the
    server refuses whole (one entry it cannot read, say) goes back to its runs, each delivered
    in a batch of its own (`Outbox.deliver`), so one bad entry holds back no other."""

    def __init__(
        self,
        outbox: Outbox,
        upload_many: Callable[[Sequence[str]], ResultsBatchStored],
        stop: threading.Event,
        gather_s: float = GATHER_S,
    ) -> None:
        self.outbox = outbox
        self._upload_many = upload_many
        self._stop = stop
        self._gather_s = gather_s
        self._waiting: list[tuple[Path, Future[bool | None]]] = []
        self._lock = threading.Condition()
        self._thread: threading.Thread | None = None
        self._backoff_s = 1.0
        self.requests = 0  # batches sent

    def deliver(self, entry: Path) -> bool:
        """Deliver ``entry``, which the caller holds (`Outbox.put` with ``hold``), with others,
        and release it; True once the server has it or refused it for good (its answer in
        `Outbox.refused`), False when the agent stops first."""
        answer: Future[bool | None] = Future()
        try:
            with self._lock:
                if self._thread is None or not self._thread.is_alive():
                    self._thread = threading.Thread(target=self._serve, name="uploads", daemon=True)
                    self._thread.start()
                self._waiting.append((entry, answer))
                self._lock.notify()
            delivered = answer.result()
        finally:
            self.outbox.release(entry)
        if delivered is None:  # in a batch of its own
            return self.outbox.deliver(self._upload_many, self._stop, until=entry)
        return delivered

    def _serve(self) -> None:
        while True:
            with self._lock:
                while not self._waiting:
                    if self._stop.is_set():
                        return
                    self._lock.wait(0.5)
            self._stop.wait(self._gather_s)  # let the runs finishing together join
            with self._lock:
                batch: list[tuple[Path, Future[bool | None]]] = []
                size = 0
                while self._waiting and len(batch) < MAX_BATCH_RESULTS:
                    entry, answer = self._waiting[0]
                    entry_size = _size(entry)
                    if batch and size + entry_size > MAX_BATCH_BYTES:
                        break
                    batch.append(self._waiting.pop(0))
                    size += entry_size
            try:
                self._send(batch)
            except Exception as error:  # noqa: BLE001 - never leave a run waiting for an answer
                log.exception("outbox: a batch of %d uploads failed (%r)", len(batch), error)
                for _, answer in batch:
                    if not answer.done():
                        answer.set_result(None)

    def _send(self, batch: list[tuple[Path, Future[bool | None]]]) -> None:
        mine: list[tuple[Path, Future[bool | None], str]] = []
        for entry, answer in batch:  # held by their runs: nobody else delivers them
            try:
                mine.append((entry, answer, entry.read_text()))
            except FileNotFoundError:  # gone (delivered by a previous attempt)
                answer.set_result(True)
        retry = False
        try:
            retry = self._deliver(mine)
        finally:
            if retry:  # first in line again, joined by whatever finished meanwhile
                with self._lock:
                    self._waiting[:0] = [(entry, answer) for entry, answer, _ in mine]
            for _, answer, _ in mine:
                if not answer.done() and not retry:
                    answer.set_result(None)
        if retry:
            self._stop.wait(self._backoff_s)
            self._backoff_s = min(MAX_BACKOFF_S, self._backoff_s * 2)

    def _deliver(self, mine: list[tuple[Path, Future[bool | None], str]]) -> bool:
        """Send ``mine``; True when it is to be sent again after a back-off (the server was
        unreachable, or busy)."""
        if not mine:
            return False
        if self._stop.is_set():
            for _, answer, _ in mine:
                answer.set_result(False)
            return False
        try:
            stored = self._upload_many([text for _, _, text in mine])
        except ApiError as error:
            if error.status_code < 500 and error.status_code != 429:
                log.warning(
                    "outbox: %d uploads refused together (%s); each goes in a batch of its own",
                    len(mine),
                    error,
                )
                return False  # each run delivers its own entry (answered None)
            failure: Exception = error
        except httpx.TransportError as error:
            failure = error
        else:
            self._backoff_s = 1.0
            self.requests += 1
            self._store(mine, stored)
            return False
        log.warning(
            "outbox: %d uploads not delivered (%s); retrying in %.0f s",
            len(mine),
            failure,
            self._backoff_s,
        )
        return True

    def _store(
        self, mine: list[tuple[Path, Future[bool | None], str]], stored: ResultsBatchStored
    ) -> None:
        outcomes = {outcome.run_id: outcome for outcome in stored.outcomes}
        done = []
        for entry, answer, _ in mine:
            outcome = outcomes.get(_run_id(entry))
            if outcome is None:
                continue  # not answered: delivered in a batch of its own
            refusal = None if outcome.status == 200 else ApiError(outcome.status, outcome.detail)
            self.outbox.settled(entry, outcome.run_id, refusal)
            done.append(answer)
        if done:
            _fsync_directory(self.outbox.directory)
        for answer in done:
            answer.set_result(True)


def _size(entry: Path) -> int:
    try:
        return entry.stat().st_size
    except OSError:
        return 0


def _run_id(entry: Path) -> int:
    match = ENTRY.match(entry.name)
    return int(match[2]) if match else -1


def _fsync_directory(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _sequence(entry: Path) -> int:
    match = ENTRY.match(entry.name)
    return int(match[1]) if match else 0
