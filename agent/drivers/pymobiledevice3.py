"""Real iPhones through pymobiledevice3 11.x (asyncio), on the agent's threads.

- Discovery: usbmux Listen keeps the attached set live (`UsbmuxWatcher`); lockdown gives each
  device's identity (ProductType → device class, ProductVersion).
- Health: pairing, developer mode, battery and charging from lockdown; "locked" when lockdown
  refuses to start a service for a passcode.
- Install: installation_proxy installs the harness .ipa when missing or of another version; the
  build's .mlpackage goes over house_arrest/AFC into the app's Documents
  (`models/<sha256>/model.mlpackage`, then a `complete` marker), once per artifact.
- A run: push job.json, launch (a `Launcher`: DVT on real phones), poll for the `done` marker,
  pull results.json (checked against the marker's digest); the harness's syslog lines are
  captured for the run's log.

Every pymobiledevice3 failure becomes a `DriverError` with a reason (see `ios_errors`).
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
from pymobiledevice3 import usbmux
from pymobiledevice3.exceptions import PasswordRequiredError, PyMobileDevice3Exception
from pymobiledevice3.lockdown import LockdownClient, create_using_usbmux
from pymobiledevice3.services.house_arrest import HouseArrestService
from pymobiledevice3.services.installation_proxy import InstallationProxyService

from agent.artifacts import PackageCache, directory_bytes
from agent.drivers import ios_container as container
from agent.drivers.aio import LoopThread
from agent.drivers.base import Cancellation, DriverError, InstalledModel, RunCancelled
from agent.drivers.ios_device import (
    DeviceRecord,
    IosDriverOptions,
    UnknownDevice,
    device_info,
    ipa_version,
)
from agent.drivers.ios_errors import (
    CONNECTION_LOST,
    DEVELOPER_MODE_OFF,
    DISCONNECTED,
    LOCKED,
    NOT_PAIRED,
    device_error,
)
from agent.drivers.ios_syslog import start_capture
from agent.drivers.launchers import Launcher
from decodebench.contracts.protocol import DeviceInfo, RunResult
from decodebench.harness import (
    HARNESS_LOG,
    JOB_FILE,
    RESULTS_FILE,
    HarnessJob,
    package_path,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

READY = "ready"
LOG_TAIL_LINES = 40


class Pymobiledevice3Driver:
    def __init__(self, options: IosDriverOptions, launcher: Launcher) -> None:
        from agent.drivers.usbmux_watch import UsbmuxWatcher

        self.options = options
        self.name = options.driver_name
        self.launcher = launcher
        self._devices: dict[str, DeviceRecord] = {}
        self._packages = PackageCache(options.work_dir / "packages")
        self._pair_records = options.work_dir / "pair-records"
        self._ipa = ipa_version(options.harness_ipa) if options.harness_ipa else None
        if self._ipa is not None and self._ipa[0] != options.bundle_id:
            raise DriverError(
                f"{options.harness_ipa} is {self._ipa[0]}, not the harness {options.bundle_id}"
            )
        self._loop = LoopThread(f"{self.name}-driver")
        self._watcher = UsbmuxWatcher(options.usbmux_address, self._attached, self._detached)
        self._identifying: set[asyncio.Future[Any]] = set()
        self._watch_task = self._loop.spawn(self._watcher.run())
        self._wait_for_first_inventory()

    # discovery

    def _wait_for_first_inventory(self) -> None:
        """Until every device usbmuxd lists now has been identified (or given up on)."""

        async def settle() -> None:
            await self._watcher.listening.wait()
            try:
                listed = await usbmux.list_devices(usbmux_address=self.options.usbmux_address)
            except (PyMobileDevice3Exception, OSError):
                return
            while not all(self._identified(entry.serial) for entry in listed):
                await asyncio.sleep(0.02)

        try:
            self._loop.run(settle(), timeout_s=self.options.discovery_timeout_s)
        except TimeoutError:
            log.warning(
                "device discovery still in progress after %g s", self.options.discovery_timeout_s
            )

    def _identified(self, udid: str) -> bool:
        device = self._devices.get(udid)
        return device is not None and device.identified

    async def _attached(self, udid: str) -> None:
        task = asyncio.ensure_future(self._identify(udid))
        self._identifying.add(task)
        task.add_done_callback(self._identifying.discard)

    async def _detached(self, udid: str) -> None:
        device = self._devices.get(udid)
        if device is not None:
            device.note("detached from usbmuxd")
            self._stop_syslog(device)

    async def _identify(self, udid: str) -> None:
        device = self._devices.setdefault(udid, DeviceRecord(udid))
        try:
            await self._read_identity(device)
        finally:
            device.identified = True

    async def _read_identity(self, device: DeviceRecord) -> None:
        udid = device.udid
        for attempt in range(3):
            try:
                async with self._lockdown(udid) as lockdown:
                    values = lockdown.all_values
            except (PyMobileDevice3Exception, *CONNECTION_LOST, OSError) as error:
                device.problem = f"cannot read its identity: {type(error).__name__}: {error}"
                await asyncio.sleep(0.5 * (attempt + 1))
                continue
            try:
                device.info = device_info(udid, values, self.name, self.options.simulated)
            except UnknownDevice as error:
                device.problem = str(error)
                log.warning("device %s ignored: %s", udid, device.problem)
                return
            device.problem = ""
            log.info(
                "device %s is a %s (%s, iOS %s)",
                udid,
                device.info.device_class,
                device.info.product_type,
                device.info.os_version,
            )
            return
        log.warning("device %s ignored: %s", udid, device.problem)

    def discover(self) -> list[DeviceInfo]:
        return [
            device.info
            for udid, device in sorted(list(self._devices.items()))  # a copy: the loop adds
            if device.info is not None and self._watcher.is_attached(udid)
        ]

    # the sync/async seam

    @contextlib.asynccontextmanager
    async def _lockdown(self, udid: str) -> AsyncIterator[LockdownClient]:
        lockdown = await create_using_usbmux(
            serial=udid,
            autopair=False,
            usbmux_address=self.options.usbmux_address,
            pairing_records_cache_folder=self._pair_records,
        )
        try:
            yield lockdown
        finally:
            await lockdown.close()

    @contextlib.asynccontextmanager
    async def _documents(self, lockdown: LockdownClient) -> AsyncIterator[HouseArrestService]:
        afc = await HouseArrestService.create(lockdown, self.options.bundle_id, documents_only=True)
        async with afc:
            yield afc

    def _record(self, device: DeviceInfo) -> DeviceRecord:
        record = self._devices.get(device.udid)
        if record is None or not self._watcher.is_attached(device.udid):
            raise DriverError(
                f"device {device.udid} is not attached to this host", device_status=DISCONNECTED
            )
        return record

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
            attached = self._loop.run(self._still_attached(udid, detaches), timeout_s=10)
            raise device_error(
                error, udid, step, attached=attached, usbmux=self.options.usbmux_address
            ) from error

    async def _still_attached(self, udid: str, detaches_before: int) -> bool:
        """Whether the device stayed plugged in; usbmuxd may learn of an unplug just after the
        connection broke, so a yes is confirmed once more a moment later."""
        for delay_s in (0.0, 0.5):
            await asyncio.sleep(delay_s)
            if self._watcher.detach_count.get(udid, 0) != detaches_before:
                return False
            try:
                listed = await usbmux.list_devices(usbmux_address=self.options.usbmux_address)
            except (PyMobileDevice3Exception, OSError):
                return False
            if not any(entry.matches_udid(udid) for entry in listed):
                return False
        return True

    # health

    def health(self, device: DeviceInfo) -> DeviceInfo:
        try:
            self._record(device)
            return self._step(
                device, "checking its health", lambda lockdown: self._health(device, lockdown), 30
            )
        except DriverError as error:
            status = error.device_status or f"unreachable: {error}"
            return device.model_copy(update={"status": status[:64]})

    async def _health(self, device: DeviceInfo, lockdown: LockdownClient) -> DeviceInfo:
        update: dict[str, Any] = {"status": READY}
        with contextlib.suppress(PyMobileDevice3Exception):
            battery = await lockdown.get_value("com.apple.mobile.battery")
            if isinstance(battery, dict):
                level = battery.get("BatteryCurrentCapacity")
                update["battery_level"] = int(level) if isinstance(level, int) else None
                update["charging"] = bool(
                    battery.get("BatteryIsCharging") or battery.get("ExternalConnected")
                )
        if not lockdown.paired:
            update["status"] = NOT_PAIRED
        elif lockdown.has_developer_mode and not await lockdown.get_developer_mode_status():
            update["status"] = DEVELOPER_MODE_OFF
        else:
            try:
                probe = HouseArrestService(lockdown)
                await probe.connect()
                await probe.close()
            except PasswordRequiredError:
                update["status"] = LOCKED
        return device.model_copy(update=update)

    # the run

    def prepare(self, device: DeviceInfo) -> None:
        record = self._record(device)
        record.notes.clear()
        record.syslog.clear()
        record.pid = None
        status = self.health(device).status
        if status != READY:
            raise DriverError(f"device {device.udid} is not ready: {status}", device_status=status)
        record.note("prepared: paired, developer mode on, unlocked")

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
        bundle_id = self.options.bundle_id
        async with InstallationProxyService(lockdown) as proxy:
            apps = await proxy.get_apps(application_type="User", bundle_identifiers=[bundle_id])
        installed = apps.get(bundle_id)
        installed_version = (
            None
            if installed is None
            else (
                bundle_id,
                str(installed.get("CFBundleShortVersionString")),
                str(installed.get("CFBundleVersion")),
            )
        )
        if installed is not None and (self._ipa is None or installed_version == self._ipa):
            return
        if self.options.harness_ipa is None:
            raise DriverError(
                f"the harness app {bundle_id} is not installed on device {lockdown.udid} and the "
                "agent has no --harness-ipa to install (build it from ios_harness/)"
            )
        log.info(
            "device %s: installing %s (%s)", lockdown.udid, self.options.harness_ipa.name, self._ipa
        )
        async with InstallationProxyService(lockdown) as proxy:
            await proxy.install_from_local(self.options.harness_ipa)

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
        pushed = job.model_copy(update={"package_path": package_path(job.artifact_sha256)})

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
            return await self.launcher.launch(
                lockdown,
                self.options.bundle_id,
                ["--job", JOB_FILE],
                {"DECODEBENCH_RUN_ID": str(job.run_id)},
            )

        record.pid = self._step(device, "launching the harness", launch)
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
                                f"the harness exited without finishing the run ({state.reason})"
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
        self._watch_task.cancel()
        self._loop.stop()
