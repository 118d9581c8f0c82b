"""pymobiledevice3's exceptions as run failure reasons a lab engineer can act on.

Each maps to a `DriverError` whose message says what happened and what to do, and, when the
failure is about the device rather than the run, a `device_status` shown on the fleet page.
"""

from __future__ import annotations

import asyncio

from pymobiledevice3.exceptions import (
    AfcException,
    AppInstallError,
    AppNotInstalledError,
    ConnectionFailedToUsbmuxdError,
    ConnectionTerminatedError,
    DeveloperModeIsNotEnabledError,
    DeviceNotFoundError,
    FatalPairingError,
    InvalidHostIDError,
    LockdownError,
    MuxException,
    NoDeviceConnectedError,
    NotPairedError,
    PasscodeRequiredError,
    PasswordRequiredError,
    PyMobileDevice3Exception,
    StartServiceError,
    TunneldConnectionError,
)

from agent.drivers.base import DriverError
from agent.drivers.fixes import (  # noqa: F401  (statuses are re-exported)
    DDI_HINT,
    DDI_NOT_MOUNTED,
    DEVELOPER_MODE_HINT,
    DEVELOPER_MODE_OFF,
    DISCONNECTED,
    FIXES,
    KILLED_BY_IOS,
    LOCKED,
    LOCKED_HINT,
    NO_TUNNEL,
    NOT_PAIRED,
    PAIRING_HINT,
    PROFILE_HINT,
    PROFILE_UNTRUSTED,
    TUNNEL_HINT,
    USBMUXD_DOWN,
)

CONNECTION_LOST = (
    ConnectionTerminatedError,
    ConnectionError,
    asyncio.IncompleteReadError,
    MuxException,
    DeviceNotFoundError,
    NoDeviceConnectedError,
    EOFError,
)


class LaunchError(DriverError):
    """The harness could not be launched (the message is the device's reason)."""


def device_error(
    error: BaseException, udid: str, step: str, *, attached: bool, usbmux: str | None = None
) -> DriverError:
    """The DriverError for `error`, raised while `step` on device `udid`."""
    if isinstance(error, DriverError):
        return error
    if isinstance(error, ConnectionFailedToUsbmuxdError):
        where = usbmux or "the system socket"
        return DriverError(
            f"usbmuxd is not reachable at {where} while {step}: is it running?",
            device_status=USBMUXD_DOWN,
        )
    if not attached:
        return DriverError(
            f"device {udid} was disconnected while {step} (USB cable, hub or usbmuxd)",
            device_status=DISCONNECTED,
        )
    if isinstance(error, (PasswordRequiredError, PasscodeRequiredError)):
        return DriverError(
            f"device {udid} is locked (passcode required) while {step}: {LOCKED_HINT}",
            device_status=LOCKED,
        )
    if isinstance(error, (NotPairedError, InvalidHostIDError, FatalPairingError)):
        return DriverError(
            f"device {udid} is not paired with this host while {step}: {PAIRING_HINT}",
            device_status=NOT_PAIRED,
        )
    if isinstance(error, DeveloperModeIsNotEnabledError):
        return DriverError(
            f"developer mode is off on device {udid}: {DEVELOPER_MODE_HINT}",
            device_status=DEVELOPER_MODE_OFF,
        )
    if isinstance(error, AppNotInstalledError):
        return DriverError(
            f"the harness app is not installed on device {udid} while {step}: {error}"
        )
    if isinstance(error, AppInstallError):
        return DriverError(f"installing the harness on device {udid} failed: {error}")
    if isinstance(error, AfcException):
        return DriverError(f"file transfer with device {udid} failed while {step}: {error}")
    if isinstance(error, StartServiceError):
        return DriverError(
            f"device {udid} refused to start {error.service_name} while {step}: {error.message}"
        )
    if isinstance(error, TunneldConnectionError):
        return LaunchError(
            f"tunneld is not reachable while {step} on device {udid} (iOS 17+): {TUNNEL_HINT}",
            device_status=NO_TUNNEL,
        )
    if isinstance(error, CONNECTION_LOST):
        return DriverError(
            f"the connection to device {udid} was lost while {step}: {type(error).__name__}: {error}"
        )
    if isinstance(error, LockdownError):
        return DriverError(f"lockdownd on device {udid} refused a request while {step}: {error}")
    if isinstance(error, TimeoutError):
        return DriverError(f"device {udid} did not answer while {step}: {error}")
    if isinstance(error, PyMobileDevice3Exception):
        return DriverError(f"device {udid} failed while {step}: {type(error).__name__}: {error}")
    if isinstance(error, OSError):
        return DriverError(f"I/O error with device {udid} while {step}: {error}")
    return DriverError(
        f"unexpected error with device {udid} while {step}: {type(error).__name__}: {error}"
    )


def launch_refusal(message: str, udid: str) -> DriverError:
    """A launcher's refusal text as a failure with the device status it implies."""
    lowered = message.lower()
    if "locked" in lowered or "passcode" in lowered:
        return LaunchError(
            f"device {udid} refused to launch the harness: {message}", device_status=LOCKED
        )
    if "not been explicitly trusted" in lowered or "invalid code signature" in lowered:
        return LaunchError(
            f"device {udid} denied the launch: {message}; {PROFILE_HINT}",
            device_status=PROFILE_UNTRUSTED,
        )
    if "developer" in lowered:
        return LaunchError(
            f"device {udid} refused to launch the harness: {message}; {DEVELOPER_MODE_HINT}",
            device_status=DEVELOPER_MODE_OFF,
        )
    return LaunchError(f"device {udid} refused to launch the harness: {message}")


def no_tunnel(udid: str, tunneld: tuple[str, int]) -> DriverError:
    return LaunchError(
        f"tunneld at {tunneld[0]}:{tunneld[1]} has no tunnel to device {udid}; iOS 17+ launches "
        f"go through it: {TUNNEL_HINT}",
        device_status=NO_TUNNEL,
    )


def ddi_error(udid: str, problem: str) -> DriverError:
    return DriverError(
        f"the developer disk image is not mounted on device {udid}: {problem}",
        device_status=DDI_NOT_MOUNTED,
    )
