"""The device driver `--driver` names; heavy dependencies are imported only for the one in use."""

from __future__ import annotations

import dataclasses

from agent.config import AgentSettings
from agent.drivers.base import DeviceDriver
from agent.drivers.simulated import SimulatedDriver
from decodebench.timing import TimingParameters


def build_driver(settings: AgentSettings) -> DeviceDriver:
    """The driver `--driver` names; heavy dependencies are imported only for the one in use."""
    if settings.driver == "simulated":
        return SimulatedDriver(
            settings.simulated_devices(),
            settings.work_dir,
            time_scale=settings.time_scale,
            timing=TimingParameters(noise_scale=settings.noise_scale),
        )
    if settings.driver == "emulated":
        from agent.drivers.emulated import EmulatedSetup, start_emulated_driver
        from agent.drivers.faults_spec import parse_fault_specs

        setup = EmulatedSetup(
            device_classes=settings.simulated,
            faults=parse_fault_specs(settings.emulated_faults, len(settings.simulated)),
            time_scale=settings.time_scale,
            noise_scale=settings.noise_scale,
            tokens=settings.emulated_tokens,
        )
        return start_emulated_driver(
            setup,
            settings.work_dir,
            settings.name,
            poll_interval_s=min(settings.poll_interval_s, 0.5),
        )
    if settings.driver == "pymobiledevice3":
        from agent.drivers.ios.driver import IosDriverOptions, Pymobiledevice3Driver
        from agent.drivers.ios.launchers import DvtLauncher

        options = IosDriverOptions(
            work_dir=settings.work_dir / "ios",
            usbmux_address=settings.usbmux_address,
            harness_ipa=settings.harness_ipa,
            ddi_folder=settings.ddi_folder,
            min_battery=settings.min_battery,
            bundle_id=settings.harness_bundle_id,
        )
        if settings.tunneld_address:
            host, _, port = settings.tunneld_address.rpartition(":")
            options = dataclasses.replace(options, tunneld_address=(host, int(port)))
        return Pymobiledevice3Driver(options, DvtLauncher(options.tunneld_address))
    from agent.drivers.host.driver import HostDriver

    return HostDriver(
        settings.work_dir / "host",
        device_class=settings.host_device_class,
        udid=f"host-{settings.name}",
        threads=settings.host_threads,
    )
