"""The device-driver interface: the steps of one run on one device, whatever the device is.

A driver is stateful per device (what is installed, what was pushed, what the harness wrote),
so the steps are separate calls the runner sequences with `run_on_device`; between steps the
run can be cancelled (agent shutting down, lease lost).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field

from decodebench.contracts.names import DeviceStatus, Driver
from decodebench.contracts.protocol import DeviceInfo
from decodebench.contracts.results import RunResult
from decodebench.harness import HarnessJob, HarnessPrompt

__all__ = [
    "ArtifactError",
    "Cancellation",
    "DeviceDriver",
    "DriverError",
    "HarnessJob",
    "HarnessPrompt",
    "InstalledModel",
    "RunCancelled",
    "run_on_device",
]


class DriverError(Exception):
    """A device step failed; the message says which and why, for the run's failure reason.

    `device_status`, when set, is what the failure says about the device itself ("locked",
    "disconnected" …): the agent shows it on the fleet page and stops claiming runs for the
    device until a health probe finds it ready again.
    """

    def __init__(
        self, message: str, device_log: str = "", device_status: DeviceStatus | None = None
    ) -> None:
        super().__init__(message)
        self.device_log = device_log
        self.device_status = device_status


class ArtifactError(DriverError):
    """The artifact itself is unusable (not a zip, no Manifest.json …): retrying will not help."""


class RunCancelled(Exception):
    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


class InstalledModel(BaseModel):
    model_config = ConfigDict(frozen=True)

    artifact_sha256: str
    package_path: Path
    package_bytes: int = Field(ge=0, description="Unpacked size of the .mlpackage")


class Cancellation:
    """Why a run should stop early, if it should: the agent's shutdown or this run's own reason."""

    SHUTDOWN_REASON = "agent shutting down"

    def __init__(self, shutdown: threading.Event | None = None) -> None:
        self._shutdown = shutdown or threading.Event()
        self._cancelled = threading.Event()
        self._reason = ""

    def cancel(self, reason: str) -> None:
        self._reason = reason
        self._cancelled.set()

    @property
    def reason(self) -> str | None:
        if self._cancelled.is_set():
            return self._reason
        if self._shutdown.is_set():
            return self.SHUTDOWN_REASON
        return None

    def check(self) -> None:
        reason = self.reason
        if reason is not None:
            raise RunCancelled(reason)

    def sleep(self, seconds: float) -> None:
        """Sleep, waking early to raise `RunCancelled` as soon as the run is cancelled."""
        deadline = time.monotonic() + seconds
        while (remaining := deadline - time.monotonic()) > 0:
            self.check()
            self._cancelled.wait(min(remaining, 0.1))
        self.check()


class DeviceDriver(Protocol):
    name: Driver

    def discover(self) -> list[DeviceInfo]:
        """The devices attached now (drivers that watch attach/detach keep this live)."""
        ...

    def health(self, device: DeviceInfo) -> DeviceInfo:
        """Fresh facts about the device (battery, charging, thermal state) and its `status`:
        "ready", or why the device cannot run now (locked, not paired, developer mode off …)."""
        ...

    def prepare(self, device: DeviceInfo) -> None:
        """Make the device ready to run: reachable, unlocked, cool enough."""

    def install(self, device: DeviceInfo, artifact_path: Path) -> InstalledModel:
        """Install the zipped .mlpackage (with the harness) on the device."""
        ...

    def push(self, device: DeviceInfo, job: HarnessJob) -> None:
        """Put the job (prompts, token budget) where the harness will read it."""

    def launch(self, device: DeviceInfo, job: HarnessJob) -> None: ...

    def wait(
        self, device: DeviceInfo, job: HarnessJob, timeout_s: float, cancel: Cancellation
    ) -> None:
        """Block until the harness has written its results, or raise."""

    def pull_results(self, device: DeviceInfo, job: HarnessJob) -> RunResult: ...

    def logs(self, device: DeviceInfo, job: HarnessJob) -> str:
        """The device-side log of the run, for failure reasons."""
        ...

    def cleanup(self, device: DeviceInfo, job: HarnessJob) -> None: ...

    def close(self) -> None:
        """Release the driver's connections and background work (agent shutdown)."""


def run_on_device(
    driver: DeviceDriver,
    device: DeviceInfo,
    artifact_path: Path,
    job: HarnessJob,
    cancel: Cancellation,
    timeout_s: float,
) -> RunResult:
    """The lifecycle of one run: prepare, install, push, launch, wait, pull; always clean up."""
    try:
        cancel.check()
        driver.prepare(device)
        cancel.check()
        driver.install(device, artifact_path)
        cancel.check()
        driver.push(device, job)
        driver.launch(device, job)
        driver.wait(device, job, timeout_s, cancel)
        return driver.pull_results(device, job)
    except DriverError as error:
        if not error.device_log:
            error.device_log = _device_log(driver, device, job)
        raise
    finally:
        driver.cleanup(device, job)


def _device_log(driver: DeviceDriver, device: DeviceInfo, job: HarnessJob) -> str:
    try:
        return driver.logs(device, job)
    except Exception as error:  # the log is a courtesy; never hide the original failure
        return f"(device log unavailable: {error})"
