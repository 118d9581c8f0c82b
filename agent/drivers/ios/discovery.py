"""Which iPhones are attached, and who they are: usbmux Listen plus each device's lockdown identity.

`UsbmuxWatcher` keeps the attached set live; every newly attached device is identified through
lockdown (ProductType → device class, ProductVersion). Lockdown clients for the driver's steps
come from here too, with the agent's own pair-record cache.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from pymobiledevice3 import usbmux
from pymobiledevice3.exceptions import PyMobileDevice3Exception
from pymobiledevice3.lockdown import LockdownClient, create_using_usbmux

from agent.drivers.aio import LoopThread
from agent.drivers.base import DriverError
from agent.drivers.ios.device import DeviceRecord, IosDriverOptions, UnknownDevice, device_info
from agent.drivers.ios.errors import CONNECTION_LOST, DISCONNECTED
from agent.drivers.ios.usbmux_watch import UsbmuxWatcher
from decodebench.contracts.protocol import DeviceInfo

log = logging.getLogger(__name__)


class DeviceDirectory:
    def __init__(self, options: IosDriverOptions, loop: LoopThread) -> None:
        self.options = options
        self.devices: dict[str, DeviceRecord] = {}
        self._pair_records = options.work_dir / "pair-records"
        self._loop = loop
        self.watcher = UsbmuxWatcher(options.usbmux_address, self._attached, self._detached)
        self._identifying: set[asyncio.Future[Any]] = set()
        self.on_detached: list[Any] = []
        self.watch_task = loop.spawn(self.watcher.run())
        self._wait_for_first_inventory()

    def _wait_for_first_inventory(self) -> None:
        """Until every device usbmuxd lists now has been identified (or given up on)."""

        async def settle() -> None:
            await self.watcher.listening.wait()
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
        device = self.devices.get(udid)
        return device is not None and device.identified

    async def _attached(self, udid: str) -> None:
        task = asyncio.ensure_future(self._identify(udid))
        self._identifying.add(task)
        task.add_done_callback(self._identifying.discard)

    async def _detached(self, udid: str) -> None:
        device = self.devices.get(udid)
        if device is not None:
            device.note("detached from usbmuxd")
            for callback in self.on_detached:
                callback(device)

    async def _identify(self, udid: str) -> None:
        device = self.devices.setdefault(udid, DeviceRecord(udid))
        try:
            await self._read_identity(device)
        finally:
            device.identified = True

    async def _read_identity(self, device: DeviceRecord) -> None:
        udid = device.udid
        for attempt in range(3):
            try:
                async with self.lockdown(udid) as lockdown:
                    values = lockdown.all_values
            except (PyMobileDevice3Exception, *CONNECTION_LOST, OSError) as error:
                device.problem = f"cannot read its identity: {type(error).__name__}: {error}"
                await asyncio.sleep(0.5 * (attempt + 1))
                continue
            try:
                device.info = device_info(
                    udid, values, self.options.driver_name, self.options.simulated
                )
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
            for udid, device in sorted(list(self.devices.items()))  # a copy: the loop adds
            if device.info is not None and self.watcher.is_attached(udid)
        ]

    def record(self, device: DeviceInfo) -> DeviceRecord:
        record = self.devices.get(device.udid)
        if record is None or not self.watcher.is_attached(device.udid):
            raise DriverError(
                f"device {device.udid} is not attached to this host", device_status=DISCONNECTED
            )
        return record

    @contextlib.asynccontextmanager
    async def lockdown(self, udid: str) -> AsyncIterator[LockdownClient]:
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

    async def still_attached(self, udid: str, detaches_before: int) -> bool:
        """Whether the device stayed plugged in; usbmuxd may learn of an unplug just after the
        connection broke, so a yes is confirmed once more a moment later."""
        for delay_s in (0.0, 0.5):
            await asyncio.sleep(delay_s)
            if self.watcher.detach_count.get(udid, 0) != detaches_before:
                return False
            try:
                listed = await usbmux.list_devices(usbmux_address=self.options.usbmux_address)
            except (PyMobileDevice3Exception, OSError):
                return False
            if not any(entry.matches_udid(udid) for entry in listed):
                return False
        return True
