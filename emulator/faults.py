"""What can go wrong with an emulated iPhone, and how to ask for it on a command line.

A device's *condition* is a standing state (locked, developer mode off, not paired, low battery,
hot); a *fault* fires on an event of a run, a number of times:

- ``disconnect-mid-push``: the cable is pulled while the agent pushes a model (the device detaches
  from usbmuxd after some bytes and re-attaches ``reattach_after_s`` later);
- ``app-crash``: the harness crashes (SIGSEGV) after launch, leaving no results;
- ``slow``: the harness takes ``slow_s`` seconds longer than its timing says;
- ``lock-during-run``: the device auto-locks as the harness is launched (launch refused);
- ``killed-by-os``: the OS kills the harness (jetsam) right after DVT launched it;
- ``ddi-mount-refused``: the image mounter refuses to mount the developer disk image;
- ``tunnel-drop``: the iOS 17+ tunnel goes away when the harness is launched.
- ``interrupt``: the harness leaves the foreground mid-run (an app switch, a call): it abandons
  the run with ``ok: false``, reason ``interrupted`` (``emulator.run_watch``).

Standing conditions: ``locked``, ``developer-mode-off``, ``not-paired``, ``untrusted-profile``
(the harness's developer profile is not trusted: DVT launches are denied), ``ddi-mounted`` (the
developer disk image is mounted already; otherwise the host must mount it), ``no-tunnel`` (iOS
17+: tunneld has no tunnel to it), ``ios=16.7.10`` (the version it reports), ``free=2e9`` (free
bytes on its disk), ``battery=10``, ``charging=false``, ``thermal=serious``.

Spec strings (``--emulated-fault``): e.g. ``disconnect-mid-push``, ``app-crash:2`` (fires
twice), ``slow:always``, ``locked``, ``battery=10``.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from enum import StrEnum

from decodebench.contracts.results import ThermalState


class FaultKind(StrEnum):
    disconnect_mid_push = "disconnect-mid-push"
    app_crash = "app-crash"
    slow = "slow"
    lock_during_run = "lock-during-run"
    killed_by_os = "killed-by-os"
    ddi_mount_refused = "ddi-mount-refused"
    tunnel_drop = "tunnel-drop"
    interrupt = "interrupt"


@dataclass
class Fault:
    kind: FaultKind
    remaining: int | None = 1  # None: fires every time

    def take(self) -> bool:
        if self.remaining is None:
            return True
        if self.remaining <= 0:
            return False
        self.remaining -= 1
        return True


@dataclass
class Condition:
    """The standing state of an emulated device; tests and specs change it."""

    locked: bool = False
    developer_mode: bool = True
    paired: bool = True
    battery_level: int = 87
    charging: bool = True
    thermal_state: ThermalState = ThermalState.nominal
    profile_trusted: bool = True
    ddi_mounted: bool = False
    tunnel: bool = True
    os_version: str | None = None  # None: what a current phone of its class reports
    free_bytes: int = 64 * 10**9


class FaultPlan:
    """The faults armed on one device; thread-safe (the harness runs on its own thread)."""

    def __init__(self, faults: list[Fault] | None = None) -> None:
        self._faults = list(faults or [])
        self._lock = threading.Lock()
        self.fired: list[FaultKind] = []

    def arm(self, kind: FaultKind | str, times: int | None = 1) -> None:
        with self._lock:
            self._faults.append(Fault(FaultKind(kind), times))

    def take(self, kind: FaultKind) -> bool:
        with self._lock:
            for fault in self._faults:
                if fault.kind == kind and fault.take():
                    self.fired.append(kind)
                    return True
            return False


_STATIC = {
    "locked",
    "developer-mode-off",
    "not-paired",
    "untrusted-profile",
    "ddi-mounted",
    "no-tunnel",
}


def apply_spec(spec: str, condition: Condition, plan: FaultPlan) -> None:
    """Apply one spec string (see the module docstring); ValueError names what is wrong."""
    spec = spec.strip()
    if "=" in spec:
        name, _, value = spec.partition("=")
        if name == "battery":
            level = int(value)
            if not 0 <= level <= 100:
                raise ValueError(f"battery level {level} is outside 0..100")
            condition.battery_level = level
        elif name == "charging":
            condition.charging = value.lower() in {"1", "true", "yes"}
        elif name == "thermal":
            condition.thermal_state = ThermalState(value)
        elif name == "ios":
            if not all(part.isdigit() for part in value.split(".")):
                raise ValueError(f"ios={value!r} is not a version such as 16.7.10")
            condition.os_version = value
        elif name == "free":
            condition.free_bytes = int(float(value))
        else:
            raise ValueError(
                f"unknown setting {name!r} in {spec!r}: battery, charging, thermal, ios or free"
            )
        return
    if spec in _STATIC:
        condition.locked |= spec == "locked"
        condition.developer_mode &= spec != "developer-mode-off"
        condition.paired &= spec != "not-paired"
        condition.profile_trusted &= spec != "untrusted-profile"
        condition.ddi_mounted |= spec == "ddi-mounted"
        condition.tunnel &= spec != "no-tunnel"
        return
    name, _, count = spec.partition(":")
    try:
        kind = FaultKind(name)
    except ValueError:
        known = ", ".join([*(kind.value for kind in FaultKind), *sorted(_STATIC)])
        raise ValueError(f"unknown fault {name!r}; known: {known}") from None
    if count in ("", "once"):
        plan.arm(kind, 1)
    elif count == "always":
        plan.arm(kind, None)
    else:
        plan.arm(kind, int(count))
