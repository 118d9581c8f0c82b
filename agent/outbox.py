"""Finished runs' results, kept on disk until the server has them.

A run's results are written to the outbox (atomically: a temporary file, fsync'd, renamed, the
directory fsync'd) before the first upload is tried, so neither a server outage of any length
nor an agent restart loses a finished run. Each device's executor delivers its own entry at once
(entries of different devices go up concurrently: one agent serves many devices); the backlog
left by an outage is delivered oldest first, by whichever device thread is about to claim, each
entry by one thread at a time. Uploads are idempotent per (run, prompt) on the server, so
delivering one twice would still store it once.
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
from collections.abc import Callable
from pathlib import Path

import httpx

from decodebench.client import ApiError
from decodebench.contracts.protocol import RunResult

log = logging.getLogger(__name__)
ENTRY = re.compile(r"^(\d{12})-run-(\d+)\.json\Z")
MAX_BACKOFF_S = 10.0


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

    def put(self, run_id: int, result: RunResult) -> Path:
        """Store ``result`` durably; returns its entry."""
        payload = json.dumps({"run_id": run_id, "result": result.model_dump(mode="json")})
        with self._write_lock:  # only the number: devices write their entries concurrently
            self._sequence += 1
            sequence = self._sequence
        final = self.directory / f"{sequence:012d}-run-{run_id}.json"
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
        upload: Callable[[int, RunResult], object],
        stop: threading.Event,
        until: Path | None = None,
    ) -> bool:
        """Deliver ``until`` alone, or else every entry nobody else is delivering (oldest
        first), retrying while the server is unreachable or failing, until done or ``stop`` is
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
            if not self._take(entry):
                stop.wait(0.05)  # another thread is delivering it; see how that ends
                continue
            try:
                if entry.exists():
                    self._deliver_one(entry, upload)
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

    def _take(self, entry: Path) -> bool:
        with self._flight_lock:
            if entry in self._in_flight:
                return False
            self._in_flight.add(entry)
            return True

    def _deliver_one(self, entry: Path, upload: Callable[[int, RunResult], object]) -> None:
        try:
            stored = json.loads(entry.read_text())
            run_id = int(stored["run_id"])
            result = RunResult.model_validate(stored["result"])
        except (ValueError, KeyError, TypeError) as error:  # not ours to guess: keep it aside
            log.error("outbox: %s is unreadable (%s); set aside as .unreadable", entry.name, error)
            entry.rename(entry.with_name(entry.name + ".unreadable"))
            return
        try:
            upload(run_id, result)
            log.info("outbox: delivered the results of run %d", run_id)
        except ApiError as error:
            if error.status_code >= 500 or error.status_code == 429:
                raise
            log.error(
                "outbox: the server refused the results of run %d for good: %s", run_id, error
            )
            self.refused[entry] = error
        entry.unlink()
        _fsync_directory(self.directory)


def _fsync_directory(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _sequence(entry: Path) -> int:
    match = ENTRY.match(entry.name)
    return int(match[1]) if match else 0
