"""The agent's pymobiledevice3 driver against emulated iPhones, the real client code path:
discovery, lockdown identity, attach and detach followed live, battery, and the device
conditions that show as status and refuse runs.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from agent.drivers.base import DriverError
from agent.drivers.emulated import EmulatedDriver
from emulator.fleet import EmulatedFleet
from tests.support.emulated import Build, run, wait_until

pytestmark = pytest.mark.slow  # converts real tiny-gqa builds with coremltools


def test_devices_are_discovered_with_their_lockdown_identity(
    fleet: EmulatedFleet, make_driver: Callable[..., EmulatedDriver]
) -> None:
    sixteen, seventeen = fleet.add("iphone-16-pro"), fleet.add("iphone-17-pro")

    devices = {device.udid: device for device in make_driver().discover()}

    assert set(devices) == {sixteen.udid, seventeen.udid}
    assert devices[seventeen.udid].product_type == "iPhone18,1"
    assert devices[seventeen.udid].device_class == "iphone-17-pro"
    assert devices[seventeen.udid].os_version == seventeen.identity.product_version
    assert devices[sixteen.udid].device_class == "iphone-16-pro"
    assert all(device.driver == "emulated" and device.simulated for device in devices.values())


def test_attach_and_detach_are_followed_live(
    fleet: EmulatedFleet, make_driver: Callable[..., EmulatedDriver]
) -> None:
    first = fleet.add("iphone-17-pro")
    driver = make_driver()
    assert [device.udid for device in driver.discover()] == [first.udid]

    second = fleet.add("iphone-16-pro")
    wait_until(lambda: len(driver.discover()) == 2, "the new device is discovered")
    fleet.usbmuxd.detach(first.udid)
    wait_until(
        lambda: [d.udid for d in driver.discover()] == [second.udid], "the unplugged one is gone"
    )
    fleet.usbmuxd.attach(first.udid)
    wait_until(lambda: len(driver.discover()) == 2, "it is back")


@pytest.mark.parametrize(
    ("spec", "status", "reason"),
    [
        ("locked", "locked", "is not ready: locked"),
        ("developer-mode-off", "developer mode off", "is not ready: developer mode off"),
        ("not-paired", "not paired", "is not ready: not paired"),
    ],
)
def test_device_conditions_show_as_status_and_refuse_runs(
    fleet: EmulatedFleet,
    make_driver: Callable[..., EmulatedDriver],
    builds: dict[str, Build],
    spec: str,
    status: str,
    reason: str,
) -> None:
    fleet.add("iphone-17-pro", [spec])
    driver = make_driver()
    device = driver.discover()[0]

    assert driver.health(device).status == status
    with pytest.raises(DriverError, match=reason) as caught:
        run(driver, device, builds["folded"])
    assert caught.value.device_status == status


def test_battery_and_charging_come_from_lockdown(
    fleet: EmulatedFleet, make_driver: Callable[..., EmulatedDriver]
) -> None:
    fleet.add("iphone-17-pro", ["battery=15", "charging=false"])
    driver = make_driver()

    health = driver.health(driver.discover()[0])

    assert (health.battery_level, health.charging, health.status) == (15, False, "ready")


def test_a_stopped_usbmuxd_leaves_no_device_and_a_clear_status(
    fleet: EmulatedFleet, make_driver: Callable[..., EmulatedDriver]
) -> None:
    fleet.add("iphone-17-pro")
    driver = make_driver()
    device = driver.discover()[0]

    fleet.usbmuxd.stop()

    wait_until(lambda: driver.discover() == [], "the device is gone with usbmuxd")
    assert driver.health(device).status == "disconnected"
