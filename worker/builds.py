"""Building one variant for the server: take the build's lease, have the library build the
assignment (:func:`decodebench.building.assignment.build_assignment`), upload, report."""

from __future__ import annotations

import logging
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import httpx

from decodebench.artifacts import pack_directory
from decodebench.client import ApiError, DecodebenchClient
from decodebench.contracts.workers import BuildOutcome
from decodebench.toolchain import ToolchainMismatch, check_toolchain
from worker.config import WorkerSettings

log = logging.getLogger(__name__)
_T = TypeVar("_T")

PROGRESS_INTERVAL_S = 1.0
RETRY_PAUSE_S = (1.0, 2.0, 5.0, 10.0)  # between deliveries to a server that is away


class LeaseLost(Exception):
    """The server gave the build to someone else (its lease ran out) or it was abandoned."""


def run_build(build_id: int, settings: WorkerSettings) -> str:
    """Returns what happened, for the task's result and the log.

    The build never waits on the network while it converts: progress goes to the server from
    the lease thread, which keeps trying while the server is away. A finished build delivers
    its package and report for up to ``report_patience_s``; a server that gave the build to
    another worker meanwhile refuses it (409), and that is the outcome."""
    from decodebench.building.assignment import build_assignment
    from decodebench.building.build import toolchain_versions

    with DecodebenchClient(settings.server_url, settings.token) as client:
        assignment = client.get_build_assignment(build_id)
        start = client.start_build(build_id, settings.name)
        if not start.proceed or start.lease is None:
            return f"skipped: build is {start.state}"
        lease = start.lease
        try:
            check_toolchain(assignment.toolchain, toolchain_versions())
        except ToolchainMismatch as error:
            client.fail_build(build_id, lease, str(error))
            return f"refused: {error}"
        renewal = LeaseRenewal(settings, build_id, lease, start.lease_seconds or 120.0)

        def progress(stage: str, fraction: float) -> None:
            renewal.progress(stage, max(0.0, min(1.0, fraction)))

        settings.work_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=settings.work_dir, prefix=f"build-{build_id}-") as tmp:
            out_dir = Path(tmp) / "out"
            try:
                report = build_assignment(client, assignment, settings.work_dir, out_dir, progress)
                progress("upload", 1.0)
                archive = pack_directory(out_dir, Path(tmp) / "artifact.zip")
                sha256 = _delivered(
                    lambda: client.upload_artifact(archive), settings, f"build {build_id} package"
                )
            except LeaseLost as error:
                renewal.stop()
                log.warning("build %s: stopped, %s", build_id, error)
                return f"refused: {error}"
            except Exception as error:
                log.exception("build %s failed", build_id)
                renewal.stop()
                client.fail_build(build_id, lease, f"{type(error).__name__}: {error}")
                return f"failed: {error}"
            renewal.stop()
            outcome = BuildOutcome(lease=lease, artifact_sha256=sha256, report=report)
            try:
                _delivered(
                    lambda: client.complete_build(build_id, outcome),
                    settings,
                    f"build {build_id} report",
                )
            except ApiError as error:
                if error.status_code != 409:
                    raise
                log.warning("build %s: completion refused, built elsewhere: %s", build_id, error)
                return f"refused: {error}"
            return f"built {sha256}"


def _away(error: Exception) -> bool:
    """The server is unreachable or its database is (503): worth trying again."""
    return isinstance(error, httpx.TransportError) or (
        isinstance(error, ApiError) and error.status_code == 503
    )


def _delivered(send: Callable[[], _T], settings: WorkerSettings, what: str) -> _T:
    deadline = time.monotonic() + settings.report_patience_s
    attempt = 0
    while True:
        try:
            return send()
        except (httpx.TransportError, ApiError) as error:
            if not _away(error) or time.monotonic() > deadline:
                raise
            pause = RETRY_PAUSE_S[min(attempt, len(RETRY_PAUSE_S) - 1)]
            log.warning("%s: the server is away (%s); trying again in %g s", what, error, pause)
            attempt += 1
            time.sleep(pause)


class LeaseRenewal:
    """Holds the build's lease from a thread while the build runs: it sends the latest progress
    (which renews the lease) at most every second, or a bare renewal every third of the lease,
    so a conversion stage of any length keeps it and never waits on the network. A killed
    worker stops renewing and the server queues the build again once the lease runs out; a
    worker cut off from the server keeps building, and learns on its next report whether the
    build is still its own."""

    what = "build"  # what the lease holds, for the log

    def __init__(self, settings: WorkerSettings, build_id: int, lease: str, seconds: float) -> None:
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self._latest: tuple[str, float] | None = None
        self.lost: ApiError | None = None
        self._thread = threading.Thread(
            target=self._renew,
            args=(settings, build_id, lease, max(seconds / 3, 0.5)),
            name=f"lease-{build_id}",
            daemon=True,
        )
        self._thread.start()

    def progress(self, stage: str, fraction: float) -> None:
        """Note the build's progress for the next report; raises LeaseLost once the server has
        refused the lease, so a build someone else now holds stops."""
        if self.lost is not None:
            raise LeaseLost(f"lease refused: {self.lost}")
        with self._lock:
            self._latest = (stage, fraction)

    def _renew(self, settings: WorkerSettings, build_id: int, lease: str, every: float) -> None:
        last_renewal = time.monotonic()
        with DecodebenchClient(settings.server_url, settings.token) as client:
            while not self._stopped.wait(min(PROGRESS_INTERVAL_S, every)):
                with self._lock:
                    latest, self._latest = self._latest, None
                if latest is None and time.monotonic() - last_renewal < every:
                    continue
                try:
                    if latest is not None:
                        self._report(client, build_id, lease, *latest)
                    else:
                        self._renewal(client, build_id, lease)
                    last_renewal = time.monotonic()
                except ApiError as error:
                    if error.status_code == 409:  # taken over or abandoned: stop
                        log.warning("%s %s: lease refused: %s", self.what, build_id, error)
                        self.lost = error
                        return
                    log.warning("%s %s: lease renewal failed: %s", self.what, build_id, error)
                except httpx.TransportError as error:  # the server is away: try again
                    log.warning("%s %s: lease renewal failed: %s", self.what, build_id, error)

    def _report(
        self, client: DecodebenchClient, build_id: int, lease: str, stage: str, fraction: float
    ) -> None:
        client.report_build_progress(build_id, lease, stage, fraction)

    def _renewal(self, client: DecodebenchClient, build_id: int, lease: str) -> None:
        client.renew_build_lease(build_id, lease)

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=5)
