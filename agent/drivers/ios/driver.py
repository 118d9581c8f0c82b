"""Real iPhones through pymobiledevice3 11.x (asyncio), on the agent's threads.

- Discovery: usbmux Listen keeps the attached set live (`UsbmuxWatcher`); lockdown gives each
  device's identity (ProductType → device class, ProductVersion).
- Health: pairing, developer mode, battery and charging from lockdown; "locked" when lockdown
  refuses to start a service for a passcode.
- Install: installation_proxy installs the harness .ipa when missing or of another version
  (`install`); the build's .mlpackage goes over house_arrest/AFC into the app's Documents
  (`models/<sha256>/model.mlpackage`, then a `complete` marker), once per artifact.
- Prepare: the developer disk image is mounted from the operator's folder when it is not.
- A run: push job.json, launch (a `Launcher`: DVT), poll for the `done` marker,
  pull results.json (checked against the marker's digest); the harness's syslog lines are
  captured for the run's log.

Every pymobiledevice3 failure becomes a `DriverError` with a reason (see `errors`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from pydantic import ValidationError
from pymobiledevice3.lockdown import LockdownClient
from pymobiledevice3.services.house_arrest import HouseArrestService

from agent.artifacts import PackageCache, directory_bytes
from agent.drivers.aio import LoopThread
from agent.drivers.base import Cancellation, DriverError, InstalledModel, RunCancelled
from agent.drivers.ios import container
from agent.drivers.ios.checks import (
    CheckContext,
    battery_values,
    device_checks,
    profile_check,
    status_of,
)
from agent.drivers.ios.ddi import ensure_mounted
from agent.drivers.ios.device import DeviceRecord, IosDriverOptions, ipa_version
from agent.drivers.ios.discovery import DeviceDirectory
from agent.drivers.ios.errors import KILLED_BY_IOS, PROFILE_UNTRUSTED, LaunchError, device_error
from agent.drivers.ios.install import ensure_harness
from agent.drivers.ios.launchers import AppLaunch, Launcher
from agent.drivers.ios.syslog import start_capture
from decodebench.contracts.names import DeviceStatus
from decodebench.contracts.protocol import DeviceCheck, DeviceInfo
from decodebench.contracts.results import RunResult, ThermalState
from decodebench.harness import (
    HARNESS_LOG,
    JOB_FILE,
    RESULTS_FILE,
    HarnessJob,
    package_path,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

READY = DeviceStatus.ready
LOG_TAIL_LINES = 40


class Pymobiledevice3Driver:
    def __init__(self, options: IosDriverOptions, launcher: Launcher) -> None:
        self.options = options
        self.name = options.driver_name
        self.launcher = launcher
        self._packages = PackageCache(options.work_dir / "packages")
        self._ipa = ipa_version(options.harness_ipa) if options.harness_ipa else None
        if self._ipa is not None and self._ipa[0] != options.bundle_id:
            raise DriverError(
                f"{options.harness_ipa} is {self._ipa[0]}, not the harness {options.bundle_id}"
            )
        self._loop = LoopThread(f"{self.name}-driver")
        self._directory = DeviceDirectory(options, self._loop)
        self._directory.on_detached.append(self._stop_syslog)
        self._devices = self._directory.devices
        self._watcher = self._directory.watcher

    def discover(self) -> list[DeviceInfo]:
        return self._directory.discover()

    # the sync/async seam

    def _lockdown(self, udid: str) -> contextlib.AbstractAsyncContextManager[LockdownClient]:
        return self._directory.lockdown(udid)

    @contextlib.asynccontextmanager
    async def _documents(self, lockdown: LockdownClient) -> AsyncIterator[HouseArrestService]:
        afc = await HouseArrestService.create(lockdown, self.options.bundle_id, documents_only=True)
        async with afc:
            yield afc

    def _record(self, device: DeviceInfo) -> DeviceRecord:
        return self._directory.record(device)

    def _step(
        self,
        device: DeviceInfo,
        step: str,
        action: Callable[[LockdownClient], Awaitable[T]],
        timeout_s: float | None = None,
    ) -> T:
        """Run `action` with a fresh lockdown client; every failure becomes a DriverError."""
        udid = device.udid
        detaches = self._watcher.detach_count.get(udid, 0)

        async def with_lockdown() -> T:
            async with self._lockdown(udid) as lockdown:
                return await action(lockdown)

        try:
            return self._loop.run(with_lockdown(), timeout_s or self.options.step_timeout_s)
        except (DriverError, RunCancelled, ValidationError):
            raise
        except Exception as error:
            attached = self._loop.run(self._directory.still_attached(udid, detaches), timeout_s=10)
            raise device_error(
                error, udid, step, attached=attached, usbmux=self.options.usbmux_address
            ) from error

    # health

    def health(self, device: DeviceInfo) -> DeviceInfo:
        """`device` with its battery, status and failed checks (each with its fix)."""
        try:
            record = self._record(device)
            checks = self.checks(device, None)
        except DriverError as error:
            if error.device_status is not None:
                return device.model_copy(update={"status": error.device_status})
            return device.model_copy(
                update={"status": DeviceStatus.unreachable, "status_detail": str(error)[:200]}
            )
        checks.append(profile_check(record.launch_problem))
        update: dict[str, Any] = {
            "status": status_of(checks, can_mount=self.options.ddi_folder is not None),
            "failed_checks": [item for item in checks if item.ok is False],
        }
        update.update(self._battery(device))
        return device.model_copy(update=update)

    def checks(
        self,
        device: DeviceInfo,
        largest_model_bytes: int | None,
        thermal_state: ThermalState = ThermalState.unknown,
    ) -> list[DeviceCheck]:
        """Every precondition of `device` (see checks); DriverError when it is unreachable."""
        context = CheckContext(
            bundle_id=self.options.bundle_id,
            ipa_version=self._ipa,
            tunneld=self.options.tunneld_address,
            largest_model_bytes=largest_model_bytes,
            min_battery=self.options.min_battery,
            thermal_state=thermal_state,
            ddi_folder=self.options.ddi_folder,
        )
        return self._step(
            device, "checking it", lambda lockdown: device_checks(lockdown, context), 60
        )

    def _battery(self, device: DeviceInfo) -> dict[str, Any]:
        with contextlib.suppress(DriverError):
            return self._step(device, "reading its battery", battery_values, 30)
        return {}

    # the run

    def prepare(self, device: DeviceInfo) -> None:
        record = self._record(device)
        record.notes.clear()
        record.syslog.clear()
        record.pid = None
        status = self.health(device).status
        if status != READY:
            raise DriverError(f"device {device.udid} is not ready: {status}", device_status=status)
        mounted = self._step(
            device,
            "mounting the developer disk image",
            lambda lockdown: ensure_mounted(lockdown, self.options.ddi_folder),
        )
        record.note(f"prepared: paired, developer mode on, unlocked; {mounted}")

    def install(self, device: DeviceInfo, artifact_path: Path) -> InstalledModel:
        record = self._record(device)
        sha256 = artifact_path.stem
        package = self._packages.unpacked(sha256, artifact_path)
        package_bytes = directory_bytes(package)
        self._step(device, "installing the harness app", self._ensure_harness)
        timeout_s = self.options.step_timeout_s + package_bytes / self.options.push_bytes_s
        self._step(
            device,
            f"pushing the model ({package_bytes:,} bytes)",
            lambda lockdown: self._push_model(lockdown, record, sha256, package),
            timeout_s,
        )
        return InstalledModel(
            artifact_sha256=sha256, package_path=package, package_bytes=package_bytes
        )

    async def _ensure_harness(self, lockdown: LockdownClient) -> None:
        options = self.options
        await ensure_harness(lockdown, options.bundle_id, options.harness_ipa, self._ipa)

    async def _push_model(
        self, lockdown: LockdownClient, record: DeviceRecord, sha256: str, package: Path
    ) -> None:
        kept = self.options.models_kept - 1
        keep = {sha256, *(record.recent_models[-kept:] if kept > 0 else [])}
        async with self._documents(lockdown) as afc:
            pushed = await container.push_package(afc, sha256, package, keep)
        if pushed is None:
            record.note(f"model {sha256[:12]} already on the device")
        else:
            record.note(f"pushed model {sha256[:12]} ({pushed:,} bytes)")
        self._remember_model(record, sha256)

    @staticmethod
    def _remember_model(record: DeviceRecord, sha256: str) -> None:
        if sha256 in record.recent_models:
            record.recent_models.remove(sha256)
        record.recent_models.append(sha256)

    def push(self, device: DeviceInfo, job: HarnessJob) -> None:
        record = self._record(device)
        where = package_path(job.artifact_sha256, job.engine)  # model.mlpackage or model.aimodel
        pushed = job.model_copy(update={"package_path": where})

        async def push_job(lockdown: LockdownClient) -> None:
            async with self._documents(lockdown) as afc:
                await container.push_job(afc, pushed)

        self._step(device, f"pushing {JOB_FILE}", push_job)
        record.note(
            f"pushed {JOB_FILE}: run {job.run_id}, {len(job.prompts)} prompts x {job.decode_tokens} tokens"
        )

    def launch(self, device: DeviceInfo, job: HarnessJob) -> None:
        record = self._record(device)
        if self.options.capture_syslog:
            self._start_syslog(record)

        async def launch(lockdown: LockdownClient) -> int:
            app = AppLaunch(
                self.options.bundle_id, ["--job", JOB_FILE], {"DECODEBENCH_RUN_ID": str(job.run_id)}
            )
            return await self.launcher.launch(lockdown, app)

        try:
            record.pid = self._step(device, "launching the harness", launch)
        except LaunchError as error:
            if error.device_status == PROFILE_UNTRUSTED:
                record.launch_problem = str(error)
            raise
        record.launch_problem = None
        record.note(
            f"launched {self.options.bundle_id} (pid {record.pid}) with {self.launcher.name}"
        )

    def wait(
        self, device: DeviceInfo, job: HarnessJob, timeout_s: float, cancel: Cancellation
    ) -> None:
        record = self._record(device)

        async def wait_for_done(lockdown: LockdownClient) -> None:
            deadline = time.monotonic() + timeout_s
            polls = 0
            async with self._documents(lockdown) as afc:
                while True:
                    reason = cancel.reason
                    if reason is not None:
                        raise RunCancelled(reason)
                    if await container.is_done(afc):
                        return
                    polls += 1
                    if record.pid is not None and polls % self.options.state_every_polls == 0:
                        state = await self.launcher.state(lockdown, record.pid)
                        if state.running is False and not await container.is_done(afc):
                            raise DriverError(
                                f"the harness exited without finishing the run ({state.reason})",
                                device_status=KILLED_BY_IOS if "SIGKILL" in state.reason else None,
                            )
                    if time.monotonic() > deadline:
                        raise DriverError(f"the harness did not finish within {timeout_s:g} s")
                    await asyncio.sleep(self.options.poll_interval_s)

        self._step(
            device,
            "waiting for the harness",
            wait_for_done,
            timeout_s + self.options.step_timeout_s,
        )
        record.note("harness wrote its done marker")

    def pull_results(self, device: DeviceInfo, job: HarnessJob) -> RunResult:
        record = self._record(device)

        async def pull(lockdown: LockdownClient) -> bytes:
            async with self._documents(lockdown) as afc:
                return await container.read_results(afc, job.run_id)

        data = self._step(device, f"pulling {RESULTS_FILE}", pull)
        record.pid = None
        record.note(f"pulled {RESULTS_FILE} ({len(data):,} bytes)")
        return RunResult.model_validate_json(data)

    def logs(self, device: DeviceInfo, job: HarnessJob) -> str:
        record = self._devices.get(device.udid)
        if record is None:
            return ""
        parts = list(record.notes)
        if self._watcher.is_attached(device.udid):

            async def read_log(lockdown: LockdownClient) -> str:
                async with self._documents(lockdown) as afc:
                    return await container.read_harness_log(afc)

            with contextlib.suppress(DriverError):
                harness_log = self._step(device, f"reading {HARNESS_LOG}", read_log, 30)
                parts += [
                    f"{HARNESS_LOG}: {line}" for line in harness_log.splitlines()[-LOG_TAIL_LINES:]
                ]
        output = self.launcher.output(device.udid)
        parts += [f"dvt output: {line}" for line in output[-LOG_TAIL_LINES:]]
        parts += [f"syslog: {line}" for line in record.syslog[-LOG_TAIL_LINES:]]
        return "\n".join(parts)

    def cleanup(self, device: DeviceInfo, job: HarnessJob) -> None:
        record = self._devices.get(device.udid)
        if record is None:
            return
        self._stop_syslog(record)
        pid, record.pid = record.pid, None
        if pid is None or not self._watcher.is_attached(device.udid):
            return
        try:  # a run that failed or was cancelled must not keep the harness running
            self._step(
                device,
                "stopping the harness",
                lambda lockdown: self.launcher.kill(lockdown, pid),
                30,
            )
            record.note(f"stopped the harness (pid {pid})")
        except DriverError as error:
            log.warning("device %s: could not stop the harness: %s", device.udid, error)

    # syslog

    def _start_syslog(self, record: DeviceRecord) -> None:
        self._stop_syslog(record)

        async def start() -> None:
            task, problem = await start_capture(lambda: self._lockdown(record.udid), record.syslog)
            record.syslog_task = task
            if problem is not None:
                log.warning("device %s: no syslog capture: %s", record.udid, problem)

        try:
            self._loop.run(start(), timeout_s=10)
        except TimeoutError:
            log.warning("device %s: syslog capture did not start", record.udid)

    def _stop_syslog(self, record: DeviceRecord) -> None:
        task, record.syslog_task = record.syslog_task, None
        if task is not None:
            self._loop.loop.call_soon_threadsafe(task.cancel)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._loop.run(self.launcher.close(), timeout_s=10)
        self._directory.watch_task.cancel()
        self._loop.stop()
