"""pymobiledevice3 failures become reasons a lab engineer can act on.

How DvtLauncher picks lockdown or the tunnel is exercised against emulated phones on iOS 16 and
18 in tests/emulator/test_dvt.py."""

from __future__ import annotations

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

from agent.drivers.base import DriverError
from agent.drivers.ios.errors import LaunchError, device_error, launch_refusal

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
        (
            "Security (its profile has not been explicitly trusted by the user.)",
            "developer profile not trusted",
        ),
    ],
)
def test_launch_refusals_carry_the_device_status(message: str, status: str | None) -> None:
    refusal = launch_refusal(message, UDID)

    assert isinstance(refusal, LaunchError)
    assert message in str(refusal) and refusal.device_status == status
