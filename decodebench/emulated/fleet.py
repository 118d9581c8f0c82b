"""A set of emulated iPhones behind one fake usbmuxd, paired with one host identity."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from decodebench.emulated.device import EmulatedDevice, Identity
from decodebench.emulated.faults import Condition, FaultPlan, apply_spec
from decodebench.emulated.pairing import HostIdentity
from decodebench.emulated.usbmuxd import EmulatedUsbmuxd


class EmulatedFleet:
    """Devices are added with their class, condition/fault specs and options (see
    `EmulatedDevice`); `start()` returns the usbmux address to point pymobiledevice3 at."""

    def __init__(
        self,
        root: Path | None = None,
        seed: str = "emulated",
        unix_path: str | None = None,
        listen: tuple[str, int] = ("127.0.0.1", 0),
        **device_options: Any,
    ) -> None:
        self._own_root = root is None
        self.root = Path(tempfile.mkdtemp(prefix="dbk-emulated-")) if root is None else root
        self.seed = seed
        self.host = HostIdentity.generate()
        self.usbmuxd = EmulatedUsbmuxd(host=listen[0], port=listen[1], unix_path=unix_path)
        self.devices: list[EmulatedDevice] = []
        self._device_options = device_options
        self._attach_at_start: list[str] = []

    def add(
        self,
        device_class: str,
        specs: Iterable[str] = (),
        attached: bool = True,
        **options: Any,
    ) -> EmulatedDevice:
        index = len(self.devices)
        condition, plan = Condition(), FaultPlan()
        for spec in specs:
            apply_spec(spec, condition, plan)
        identity = Identity.for_class(device_class, f"{self.seed}\0{index}", device_id=index + 1)
        device = EmulatedDevice(
            identity,
            self.root / identity.udid,
            self.host,
            condition=condition,
            faults=plan,
            **{**self._device_options, **options},
        )
        self.devices.append(device)
        self.usbmuxd.add(device, attached=attached and self.started)
        if attached and not self.started:
            self._attach_at_start.append(device.udid)
        return device

    @property
    def started(self) -> bool:
        return bool(self.usbmuxd.address)

    def start(self) -> str:
        address = self.usbmuxd.start()
        for udid in self._attach_at_start:
            self.usbmuxd.attach(udid)
        self._attach_at_start.clear()
        return address

    @property
    def address(self) -> str:
        return self.usbmuxd.address

    def stop(self) -> None:
        self.usbmuxd.stop()
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> EmulatedFleet:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def __getitem__(self, index: int) -> EmulatedDevice:
        return self.devices[index]
