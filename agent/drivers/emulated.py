"""Emulated iPhones driven through the real pymobiledevice3 path.

The agent starts an `EmulatedFleet` (fake usbmuxd, tunneld and devices) in-process and points
the pymobiledevice3 driver at it, with the DVT launcher and a folder of emulated developer disk
images, as for real phones. Everything the devices report is labelled `driver="emulated"`,
`simulated=True`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.drivers.ios.driver import IosDriverOptions, Pymobiledevice3Driver
from agent.drivers.ios.launchers import DvtLauncher
from decodebench.contracts.names import Driver
from decodebench.contracts.protocol import DeviceInfo, RunAssignment
from decodebench.timing import TimingParameters
from emulator.ddi import write_ddi_folder
from emulator.fleet import EmulatedFleet
from emulator.ipa import make_harness_ipa

DRIVER_NAME = Driver.emulated


@dataclass(frozen=True)
class EmulatedSetup:
    device_classes: tuple[str, ...]
    faults: dict[int, tuple[str, ...]] = field(default_factory=dict)
    time_scale: float = 0.0
    noise_scale: float = 1.0
    tokens: str = "auto"
    reattach_after_s: float | None = 2.0
    slow_s: float = 30.0


class EmulatedDriver(Pymobiledevice3Driver):
    """The pymobiledevice3 driver, its fleet of emulated devices, and their lifetime together."""

    def __init__(
        self, fleet: EmulatedFleet, options: IosDriverOptions, owns_fleet: bool = True
    ) -> None:
        self.fleet = fleet
        self.owns_fleet = owns_fleet
        super().__init__(options, DvtLauncher(options.tunneld_address))

    def assign(self, device: DeviceInfo, assignment: RunAssignment) -> None:
        """Hand the emulated phone what the server sent with the run for its timing: the
        class's current profile (calibrated, after a calibration) and the build's dispatched
        ops, as the simulated driver does."""
        for emulated in self.fleet.devices:
            if emulated.udid == device.udid:
                emulated.assigned_timing[assignment.run_id] = (
                    assignment.device_profile,
                    assignment.dispatch_ops,
                )

    def close(self) -> None:
        super().close()
        if self.owns_fleet:
            self.fleet.stop()


def start_emulated_driver(
    setup: EmulatedSetup, work_dir: Path, agent_name: str, poll_interval_s: float = 0.2
) -> EmulatedDriver:
    """Start a fleet for `setup` and the driver that serves it (stopped together by close())."""
    seed = hashlib.sha256(agent_name.encode()).hexdigest()[:16]
    fleet = EmulatedFleet(
        work_dir / "emulated" / "devices",
        seed=seed,
        time_scale=setup.time_scale,
        timing=TimingParameters(noise_scale=setup.noise_scale),
        tokens=setup.tokens,
        reattach_after_s=setup.reattach_after_s,
        slow_s=setup.slow_s,
    )
    for index, device_class in enumerate(setup.device_classes):
        fleet.add(device_class, setup.faults.get(index, ()))
    fleet.start()
    try:
        return driver_for_fleet(fleet, work_dir / "emulated", poll_interval_s)
    except BaseException:
        fleet.stop()
        raise


def driver_for_fleet(
    fleet: EmulatedFleet,
    work_dir: Path,
    poll_interval_s: float = 0.2,
    owns_fleet: bool = True,
    **options: Any,
) -> EmulatedDriver:
    """A driver for a started fleet; `options` override `IosDriverOptions` fields."""
    settings = {
        "work_dir": work_dir / "host",
        "usbmux_address": fleet.address,
        "harness_ipa": make_harness_ipa(work_dir / "DecodebenchHarness.ipa"),
        "ddi_folder": write_ddi_folder(work_dir / "ddi"),
        "tunneld_address": fleet.tunneld_address,
        "driver_name": DRIVER_NAME,
        "simulated": True,
        "poll_interval_s": poll_interval_s,
        "state_every_polls": 1,
        **options,
    }
    return EmulatedDriver(fleet, IosDriverOptions(**settings), owns_fleet=owns_fleet)
