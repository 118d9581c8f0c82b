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

LOCKED = "locked"
NOT_PAIRED = "not paired"
DEVELOPER_MODE_OFF = "developer mode off"
DISCONNECTED = "disconnected"
USBMUXD_DOWN = "usbmuxd unreachable"
PROFILE_UNTRUSTED = "developer profile not trusted"
DDI_NOT_MOUNTED = "developer disk image not mounted"
NO_TUNNEL = "no tunnel (iOS 17+)"

_LOCKED_HINT = "unlock it, and keep Auto-Lock off (Settings > Display & Brightness)"
_DEVELOPER_MODE_HINT = "turn it on in Settings > Privacy & Security > Developer Mode (reboots)"
_PAIRING_HINT = "pair it with this host (`pymobiledevice3 lockdown pair`) and tap Trust"
_PROFILE_HINT = (
    "on the phone, trust the harness's developer in Settings > General > VPN & Device Management"
)
_TUNNEL_HINT = "start `sudo pymobiledevice3 remote tunneld` on this host and keep it running"
_DDI_HINT = (
    "put Xcode's developer disk images in the folder given by --ddi-folder "
    "(DeviceSupport/<version>/ before iOS 17, Personalized/ from iOS 17) and run `agent doctor`"
)

# One line an operator can act on, per device status a failure can leave.
FIXES = {
    LOCKED: _LOCKED_HINT,
    NOT_PAIRED: _PAIRING_HINT,
    DEVELOPER_MODE_OFF: _DEVELOPER_MODE_HINT,
    DISCONNECTED: "check the USB cable and hub; the device must show in `pymobiledevice3 usbmux list`",
    USBMUXD_DOWN: "start usbmuxd (on macOS it is always running; on Linux `systemctl start usbmuxd`)",
    PROFILE_UNTRUSTED: _PROFILE_HINT,
    DDI_NOT_MOUNTED: _DDI_HINT,
    NO_TUNNEL: _TUNNEL_HINT,
}

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
            f"device {udid} is locked (passcode required) while {step}: {_LOCKED_HINT}",
            device_status=LOCKED,
        )
    if isinstance(error, (NotPairedError, InvalidHostIDError, FatalPairingError)):
        return DriverError(
            f"device {udid} is not paired with this host while {step}: {_PAIRING_HINT}",
            device_status=NOT_PAIRED,
        )
    if isinstance(error, DeveloperModeIsNotEnabledError):
        return DriverError(
            f"developer mode is off on device {udid}: {_DEVELOPER_MODE_HINT}",
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
            f"tunneld is not reachable while {step} on device {udid} (iOS 17+): {_TUNNEL_HINT}",
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
            f"device {udid} denied the launch: {message}; {_PROFILE_HINT}",
            device_status=PROFILE_UNTRUSTED,
        )
    if "developer" in lowered:
        return LaunchError(
            f"device {udid} refused to launch the harness: {message}; {_DEVELOPER_MODE_HINT}",
            device_status=DEVELOPER_MODE_OFF,
        )
    return LaunchError(f"device {udid} refused to launch the harness: {message}")


def no_tunnel(udid: str, tunneld: tuple[str, int]) -> DriverError:
    return LaunchError(
        f"tunneld at {tunneld[0]}:{tunneld[1]} has no tunnel to device {udid}; iOS 17+ launches "
        f"go through it: {_TUNNEL_HINT}",
        device_status=NO_TUNNEL,
    )


def ddi_error(udid: str, problem: str) -> DriverError:
    return DriverError(
        f"the developer disk image is not mounted on device {udid}: {problem}",
        device_status=DDI_NOT_MOUNTED,
    )
