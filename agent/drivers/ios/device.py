"""What the pymobiledevice3 driver knows per device, its options, and device identities."""

from __future__ import annotations

import asyncio
import logging
import plistlib
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.drivers.base import DriverError
from decodebench.contracts.names import DeviceStatus, Driver
from decodebench.contracts.profiles import DEVICE_PROFILES
from decodebench.contracts.protocol import DeviceInfo
from decodebench.harness import HARNESS_BUNDLE_ID

log = logging.getLogger(__name__)


class UnknownDevice(Exception):
    """A device this agent cannot serve (no device class for its product type)."""


DRIVER_NAME = Driver.pymobiledevice3
READY = DeviceStatus.ready
LOG_TAIL_LINES = 40
DEVICE_CLASS_BY_PRODUCT = {
    product_type: profile.device_class
    for profile in DEVICE_PROFILES.values()
    for product_type in profile.product_types
}


@dataclass(frozen=True)
class IosDriverOptions:
    work_dir: Path
    usbmux_address: str | None = None
    harness_ipa: Path | None = None
    bundle_id: str = HARNESS_BUNDLE_ID
    driver_name: Driver = DRIVER_NAME
    simulated: bool = False
    poll_interval_s: float = 1.0
    state_every_polls: int = 5
    step_timeout_s: float = 120.0
    push_bytes_s: float = 5e6  # slowest transfer rate we wait for before giving up a push
    capture_syslog: bool = True
    models_kept: int = 2
    discovery_timeout_s: float = 15.0
    ddi_folder: Path | None = None  # developer disk images to mount from (never downloaded)
    tunneld_address: tuple[str, int] = ("127.0.0.1", 49151)  # pymobiledevice3's default
    min_battery: int = 20


@dataclass
class DeviceRecord:
    udid: str
    info: DeviceInfo | None = None
    problem: str = ""
    pid: int | None = None
    recent_models: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    syslog: list[str] = field(default_factory=list)
    syslog_task: asyncio.Future[Any] | None = None
    identified: bool = False  # identity read, or given up on (see `problem`)
    launch_problem: str | None = None  # the last launch's denial (an untrusted profile …)

    def note(self, message: str) -> None:
        self.notes.append(f"{time.strftime('%H:%M:%S')} {message}")
        log.debug("[%s] %s", self.udid, message)


def device_info(udid: str, values: dict[str, Any], driver: Driver, simulated: bool) -> DeviceInfo:
    """The inventory entry of a device, from its lockdown values."""
    product_type = str(values.get("ProductType", ""))
    device_class = DEVICE_CLASS_BY_PRODUCT.get(product_type)
    if device_class is None:
        raise UnknownDevice(f"product type {product_type!r} has no device class (profiles.py)")
    return DeviceInfo(
        udid=udid,
        device_class=device_class,
        product_type=product_type,
        os_version=str(values.get("ProductVersion", ""))[:32],
        driver=driver,
        simulated=simulated,
    )


def ipa_version(ipa: Path) -> tuple[str, str, str]:
    """(bundle id, CFBundleShortVersionString, CFBundleVersion) of an .ipa."""
    with zipfile.ZipFile(ipa) as archive:
        names = [
            name
            for name in archive.namelist()
            if name.startswith("Payload/")
            and name.endswith(".app/Info.plist")
            and name.count("/") == 2
        ]
        if not names:
            raise DriverError(f"{ipa} is not an .ipa: no Payload/<name>.app/Info.plist")
        info = plistlib.loads(archive.read(names[0]))
    return (
        str(info.get("CFBundleIdentifier", "")),
        str(info.get("CFBundleShortVersionString", "")),
        str(info.get("CFBundleVersion", "")),
    )
