"""Building one variant for the server: take the build's lease, have the library build the
assignment (:func:`decodebench.building.assignment.build_assignment`), upload, report."""

from __future__ import annotations

import logging
import tempfile
import threading
import time
from pathlib import Path

import httpx

from decodebench.artifacts import pack_directory
from decodebench.client import ApiError, DecodebenchClient
from decodebench.contracts.workers import BuildOutcome
from decodebench.toolchain import ToolchainMismatch, check_toolchain
from worker.config import WorkerSettings

log = logging.getLogger(__name__)

PROGRESS_INTERVAL_S = 1.0


def run_build(build_id: int, settings: WorkerSettings) -> str:
    """Returns what happened, for the task's result and the log."""
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
        last_report = 0.0

        def progress(stage: str, fraction: float) -> None:
            nonlocal last_report
            now = time.monotonic()
            if now - last_report >= PROGRESS_INTERVAL_S or fraction >= 1.0:
                last_report = now
                client.report_build_progress(build_id, lease, stage, max(0.0, min(1.0, fraction)))

        renewal = LeaseRenewal(settings, build_id, lease, start.lease_seconds or 120.0)

        settings.work_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=settings.work_dir, prefix=f"build-{build_id}-") as tmp:
            out_dir = Path(tmp) / "out"
            try:
                report = build_assignment(client, assignment, settings.work_dir, out_dir, progress)
                progress("upload", 1.0)
                archive = pack_directory(out_dir, Path(tmp) / "artifact.zip")
                sha256 = client.upload_artifact(archive)
            except Exception as error:
                log.exception("build %s failed", build_id)
                renewal.stop()
                client.fail_build(build_id, lease, f"{type(error).__name__}: {error}")
                return f"failed: {error}"
            renewal.stop()
            outcome = BuildOutcome(lease=lease, artifact_sha256=sha256, report=report)
            client.complete_build(build_id, outcome)
            return f"built {sha256}"


class LeaseRenewal:
    """Renews the build's lease from a thread every third of its length while the build runs,
    so a conversion stage of any length keeps it; a killed worker stops renewing and the server
    queues the build again once the lease runs out."""

    def __init__(self, settings: WorkerSettings, build_id: int, lease: str, seconds: float) -> None:
        self._stopped = threading.Event()
        self._thread = threading.Thread(
            target=self._renew,
            args=(settings, build_id, lease, max(seconds / 3, 0.5)),
            name=f"lease-{build_id}",
            daemon=True,
        )
        self._thread.start()

    def _renew(self, settings: WorkerSettings, build_id: int, lease: str, every: float) -> None:
        with DecodebenchClient(settings.server_url, settings.token) as client:
            while not self._stopped.wait(every):
                try:
                    client.renew_build_lease(build_id, lease)
                except ApiError as error:  # the lease is gone (taken over, abandoned): stop
                    log.warning("build %s: lease renewal refused: %s", build_id, error)
                    return
                except httpx.TransportError as error:  # the server is away: try again
                    log.warning("build %s: lease renewal failed: %s", build_id, error)

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=5)
