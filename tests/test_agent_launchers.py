"""pymobiledevice3 failures become reasons a lab engineer can act on; launchers pick their path."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pymobiledevice3.exceptions import (
    AfcFileNotFoundError,
    AppInstallError,
    AppNotInstalledError,
    ConnectionFailedToUsbmuxdError,
    ConnectionTerminatedError,
    DeveloperModeIsNotEnabledError,
    InvalidHostIDError,
    NoDeviceConnectedError,
    NotPairedError,
    PasswordRequiredError,
    StartServiceError,
)

from agent.drivers import launchers
from agent.drivers.base import DriverError
from agent.drivers.ios_errors import LaunchError, device_error, launch_refusal
from agent.drivers.launchers import DvtLauncher

UDID = "00008150-000306C8D8A3C31F"


@pytest.mark.parametrize(
    ("error", "attached", "reason", "status"),
    [
        (PasswordRequiredError(), True, "is locked (passcode required) while pushing", "locked"),
        (NotPairedError(), True, "is not paired with this host while pushing", "not paired"),
        (InvalidHostIDError(), True, "pymobiledevice3 lockdown pair", "not paired"),
        (DeveloperModeIsNotEnabledError(), True, "developer mode is off", "developer mode off"),
        (ConnectionTerminatedError(), False, "was disconnected while pushing", "disconnected"),
        (NoDeviceConnectedError(), False, "was disconnected while pushing", "disconnected"),
        (ConnectionTerminatedError(), True, "the connection to device", None),
        (
            ConnectionFailedToUsbmuxdError(),
            True,
            "usbmuxd is not reachable at 127.0.0.1:1",
            "usbmuxd unreachable",
        ),
        (AppNotInstalledError("no app"), True, "the harness app is not installed", None),
        (
            AppInstallError("ApplicationVerificationFailed"),
            True,
            "installing the harness on device",
            None,
        ),
        (AfcFileNotFoundError("gone", 8, "/Documents/x"), True, "file transfer with device", None),
        (
            StartServiceError("com.apple.afc", "InvalidService"),
            True,
            "refused to start com.apple.afc",
            None,
        ),
        (TimeoutError("no answer within 120 s"), True, "did not answer while pushing", None),
    ],
)
def test_pymobiledevice3_errors_map_to_reasons_and_device_statuses(
    error: Exception, attached: bool, reason: str, status: str | None
) -> None:
    mapped = device_error(error, UDID, "pushing the model", attached=attached, usbmux="127.0.0.1:1")

    assert isinstance(mapped, DriverError)
    assert reason in str(mapped)
    assert mapped.device_status == status


def test_an_unplugged_device_wins_over_the_exception_it_caused() -> None:
    mapped = device_error(PasswordRequiredError(), UDID, "launching", attached=False)

    assert mapped.device_status == "disconnected"


@pytest.mark.parametrize(
    ("message", "status"),
    [
        ("Locked: the device is locked", "locked"),
        ("DeveloperModeDisabled: turn on Developer Mode", "developer mode off"),
        ("ApplicationLookupFailed: not installed", None),
    ],
)
def test_launch_refusals_carry_the_device_status(message: str, status: str | None) -> None:
    refusal = launch_refusal(message, UDID)

    assert isinstance(refusal, LaunchError)
    assert message in str(refusal) and refusal.device_status == status


class FakeLockdown:
    def __init__(self, version: str) -> None:
        self.product_version = version
        self.udid = UDID


def test_dvt_uses_lockdown_before_ios_17() -> None:
    lockdown: Any = FakeLockdown("16.7.10")

    assert asyncio.run(DvtLauncher()._provider(lockdown)) is lockdown


def test_dvt_on_ios_17_and_later_needs_a_tunnel(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[tuple[str, tuple[str, int]]] = []

    async def no_tunnel(udid: str, address: tuple[str, int]) -> None:
        asked.append((udid, address))

    import pymobiledevice3.tunneld.api as tunneld_api

    monkeypatch.setattr(tunneld_api, "get_tunneld_device_by_udid", no_tunnel)
    lockdown: Any = FakeLockdown("18.6.2")

    with pytest.raises(LaunchError, match="sudo pymobiledevice3 remote tunneld"):
        asyncio.run(DvtLauncher(("127.0.0.1", 49151))._provider(lockdown))
    assert asked == [(UDID, ("127.0.0.1", 49151))]


def test_the_emulated_launcher_names_the_emulators_service() -> None:
    from decodebench.emulated.services import EMULATED_PROCESS_CONTROL, SERVICES

    assert launchers.EMULATED_PROCESS_CONTROL == EMULATED_PROCESS_CONTROL
    assert EMULATED_PROCESS_CONTROL in SERVICES
