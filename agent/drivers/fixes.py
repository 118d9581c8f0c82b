"""Device statuses a failure can leave, and the one line that fixes each (no pymobiledevice3
import: the agent's main loop attaches the fix to a held device's status)."""

from __future__ import annotations

from decodebench.contracts.names import DeviceStatus
from decodebench.contracts.protocol import DeviceCheck, DeviceInfo

LOCKED = DeviceStatus.locked
NOT_PAIRED = DeviceStatus.not_paired
DEVELOPER_MODE_OFF = DeviceStatus.developer_mode_off
DISCONNECTED = DeviceStatus.disconnected
USBMUXD_DOWN = DeviceStatus.usbmuxd_unreachable
PROFILE_UNTRUSTED = DeviceStatus.profile_untrusted
DDI_NOT_MOUNTED = DeviceStatus.ddi_not_mounted
NO_TUNNEL = DeviceStatus.no_tunnel
KILLED_BY_IOS = DeviceStatus.killed_by_ios

LOCKED_HINT = "unlock it, and keep Auto-Lock off (Settings > Display & Brightness)"
DEVELOPER_MODE_HINT = "turn it on in Settings > Privacy & Security > Developer Mode (reboots)"
PAIRING_HINT = "pair it with this host (`pymobiledevice3 lockdown pair`) and tap Trust"
PROFILE_HINT = (
    "on the phone, trust the harness's developer in Settings > General > VPN & Device Management"
)
TUNNEL_HINT = "start `sudo pymobiledevice3 remote tunneld` on this host and keep it running"
DDI_HINT = (
    "put Xcode's developer disk images in the folder given by --ddi-folder "
    "(DeviceSupport/<version>/ before iOS 17, Personalized/ from iOS 17) and run `agent doctor`"
)

# One line an operator can act on, per device status a failure can leave.
FIXES = {
    LOCKED: LOCKED_HINT,
    NOT_PAIRED: PAIRING_HINT,
    DEVELOPER_MODE_OFF: DEVELOPER_MODE_HINT,
    DISCONNECTED: "check the USB cable and hub; the device must show in `pymobiledevice3 usbmux list`",
    USBMUXD_DOWN: "start usbmuxd (on macOS it is always running; on Linux `systemctl start usbmuxd`)",
    PROFILE_UNTRUSTED: PROFILE_HINT,
    DDI_NOT_MOUNTED: DDI_HINT,
    NO_TUNNEL: TUNNEL_HINT,
    KILLED_BY_IOS: (
        "restart the phone and close other apps; if it recurs with one model, that model needs "
        "more memory than iOS grants the app"
    ),
}


def with_status_fix(info: DeviceInfo) -> DeviceInfo:
    """`info` whose status names a known failure, with that failure and its fix among its failed
    checks (a device held after a failed run says what to do)."""
    fix = FIXES.get(info.status)
    if fix is None or any(item.name == info.status for item in info.failed_checks):
        return info
    held = DeviceCheck(name=info.status, ok=False, detail="a run failed on it", fix=fix)
    return info.model_copy(update={"failed_checks": [*info.failed_checks, held]})
