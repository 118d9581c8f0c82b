"""A set of emulated iPhones behind one fake usbmuxd, paired with one host identity."""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from emulator.device import EmulatedDevice, Identity
from emulator.faults import Condition, FaultPlan, apply_spec
from emulator.pairing import HostIdentity
from emulator.tunnel import DeviceTunnel, EmulatedTunneld
from emulator.usbmuxd import EmulatedUsbmuxd

# Build versions for the iOS versions a spec may ask for (``ios=16.7.10``).
BUILD_VERSIONS = {"16": "20H350", "17": "21H420", "18": "22G100", "26": "23A355"}


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
        self.tunneld = EmulatedTunneld(self.devices)

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
        if condition.os_version is not None:
            major = condition.os_version.split(".")[0]
            identity = dataclasses.replace(
                identity,
                product_version=condition.os_version,
                build_version=BUILD_VERSIONS.get(major, identity.build_version),
            )
        device = EmulatedDevice(
            identity,
            self.root / identity.udid,
            self.host,
            condition=condition,
            faults=plan,
            **{**self._device_options, **options},
        )
        if device.major_version >= 17:
            device.tunnel = DeviceTunnel(device)
        self.devices.append(device)
        self.usbmuxd.add(device, attached=attached and self.started)
        if self.started and device.tunnel is not None and condition.tunnel:
            self.usbmuxd.call(device.tunnel.open)
        if attached and not self.started:
            self._attach_at_start.append(device.udid)
        return device

    @property
    def started(self) -> bool:
        return bool(self.usbmuxd.address)

    def start(self, tunneld_port: int = 0) -> str:
        """Serve usbmuxd, tunneld (on `tunneld_port`; 0: any) and the iOS 17+ tunnels."""
        address = self.usbmuxd.start()
        for udid in self._attach_at_start:
            self.usbmuxd.attach(udid)
        self._attach_at_start.clear()
        self.usbmuxd.call(self.tunneld.start, tunneld_port)
        for device in self.devices:
            if device.tunnel is not None and device.condition.tunnel:
                self.usbmuxd.call(device.tunnel.open)
        return address

    @property
    def tunneld_address(self) -> tuple[str, int]:
        return ("127.0.0.1", self.tunneld.port)

    def drop_tunnel(self, index: int) -> None:
        tunnel = self.devices[index].tunnel
        if tunnel is not None:
            self.usbmuxd.call(_async(tunnel.drop))

    def restore_tunnel(self, index: int) -> None:
        tunnel = self.devices[index].tunnel
        if tunnel is not None:
            self.usbmuxd.call(tunnel.open)

    @property
    def address(self) -> str:
        return self.usbmuxd.address

    def stop(self) -> None:
        if self.started and self.usbmuxd.running:
            self.usbmuxd.call(_async(self._close_tunnels))
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

    def _close_tunnels(self) -> None:
        self.tunneld.stop()
        for device in self.devices:
            if device.tunnel is not None:
                device.tunnel.drop()


def _async(function: Callable[[], None]) -> Callable[[], Any]:
    async def run() -> None:
        function()

    return run
