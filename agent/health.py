"""Health gates before a run: is this device fit to produce a comparable measurement now?

The driver reports facts (battery, charging, locked, paired, developer mode); the agent adds
what it learned from the harness (thermal state at the end of the last run) and holds devices
whose last run failed because of the device itself. The result is the device's `status`:
ready, or the reason it waits (a `DeviceStatus`, with the particulars in `status_detail`), as
shown on the fleet page.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from decodebench.contracts.names import DeviceStatus
from decodebench.contracts.protocol import DeviceInfo
from decodebench.contracts.results import ThermalState

READY = DeviceStatus.ready
BUSY = DeviceStatus.busy
HOT = {ThermalState.serious, ThermalState.critical}
MAX_HOLD_S = 300.0


@dataclass(frozen=True)
class HealthPolicy:
    """Built from the agent's settings (AgentSettings.health_policy), which own the defaults."""

    min_battery: int  # percent; ignored while charging
    cooldown_s: float  # after a run that ended serious/critical
    hold_s: float  # first hold after a device failure (locked, disconnected …); doubles


@dataclass
class DeviceHealth:
    """What the agent knows about one device beyond the driver's facts."""

    thermal_state: ThermalState = ThermalState.unknown
    thermal_at: float | None = None
    held_status: DeviceStatus | None = None
    held_until: float = 0.0
    holds: int = 0

    def record_thermal(self, state: ThermalState, now: float | None = None) -> None:
        self.thermal_state = state
        self.thermal_at = time.monotonic() if now is None else now

    def hold(self, status: DeviceStatus, policy: HealthPolicy, now: float | None = None) -> float:
        """Stop claiming for a while after a device failure; returns the hold in seconds."""
        now = time.monotonic() if now is None else now
        seconds = min(policy.hold_s * 2**self.holds, MAX_HOLD_S)
        self.holds += 1
        self.held_status = status
        self.held_until = now + seconds
        return seconds

    def release(self) -> None:
        self.held_status = None
        self.holds = 0


def gate(
    info: DeviceInfo, health: DeviceHealth, policy: HealthPolicy, now: float | None = None
) -> DeviceInfo:
    """`info` with the agent's thermal knowledge and the resulting status."""
    now = time.monotonic() if now is None else now
    info = info.model_copy(update={"thermal_state": health.thermal_state})
    if health.held_status is not None and now < health.held_until:
        return info.model_copy(update={"status": health.held_status})
    if info.status != READY:
        return info
    status, detail = _policy_status(info, health, policy, now)
    return info.model_copy(update={"status": status, "status_detail": detail})


def _policy_status(
    info: DeviceInfo, health: DeviceHealth, policy: HealthPolicy, now: float
) -> tuple[DeviceStatus, str]:
    if (
        info.battery_level is not None
        and info.battery_level < policy.min_battery
        and not info.charging
    ):
        return DeviceStatus.low_battery, f"{info.battery_level}% and not charging"
    if health.thermal_state in HOT and health.thermal_at is not None:
        remaining_s = policy.cooldown_s - (now - health.thermal_at)
        if remaining_s > 0:
            detail = f"thermal {health.thermal_state.value}, {remaining_s:.0f} s left"
            return DeviceStatus.cooling, detail
    return READY, ""
