"""Every precondition of an iPhone for runs, each with the one-line fix when it fails.

Used by `python -m agent doctor` and by the driver's health check, whose failed checks travel in
the device inventory of the agent's heartbeat. Each check asks the phone itself (lockdown,
installation_proxy, the image mounter, tunneld and RemoteServiceDiscovery) and reports what it
found; one failing check never hides the others.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.version import Version
from pymobiledevice3.exceptions import PasswordRequiredError, PyMobileDevice3Exception
from pymobiledevice3.lockdown import LockdownClient
from pymobiledevice3.services.house_arrest import HouseArrestService
from pymobiledevice3.services.installation_proxy import InstallationProxyService

from agent.drivers.ios.ddi import classic_image, is_mounted, personalized_image
from agent.drivers.ios.errors import (
    DDI_NOT_MOUNTED,
    DEVELOPER_MODE_OFF,
    FIXES,
    LOCKED,
    NO_TUNNEL,
    NOT_PAIRED,
    PROFILE_UNTRUSTED,
)
from decodebench.contracts.names import DeviceStatus
from decodebench.contracts.protocol import DeviceCheck
from decodebench.contracts.results import ThermalState
from decodebench.harness import HARNESS_PROTOCOL_VERSION

# Core ML compiles the pushed .mlpackage into an .mlmodelc next to it: room for both.
SPACE_FACTOR = 2
HOT = {ThermalState.serious, ThermalState.critical}
READY = DeviceStatus.ready
# The device status a failing check puts the device in (other failures only inform).
STATUS_BY_CHECK = {
    "paired and trusted": NOT_PAIRED,
    "developer mode": DEVELOPER_MODE_OFF,
    "screen unlocked": LOCKED,
    "tunnel": NO_TUNNEL,
}


@dataclass(frozen=True)
class CheckContext:
    bundle_id: str
    ipa_version: tuple[str, str, str] | None  # what the agent would install
    tunneld: tuple[str, int]
    largest_model_bytes: int | None  # None: the queue is unknown
    min_battery: int = 20
    thermal_state: ThermalState = ThermalState.unknown
    ddi_folder: Path | None = None


def check(name: str, ok: bool | None, detail: str, fix: str = "") -> DeviceCheck:
    return DeviceCheck(name=name, ok=ok, detail=detail[:512], fix="" if ok else fix[:512])


PROBE_NAMES = {
    "_developer_disk_image": "developer disk image",
    "_tunnel": "tunnel",
    "_harness": "harness app",
    "_battery_and_space": "battery",
}


def status_of(checks: list[DeviceCheck], can_mount: bool) -> str:
    """The device's status: the first failing check that keeps runs away, else ready."""
    for item in checks:
        if item.ok is False and item.name in STATUS_BY_CHECK:
            return STATUS_BY_CHECK[item.name]
        if item.ok is False and item.name == "developer disk image" and not can_mount:
            return DDI_NOT_MOUNTED
    return READY


def profile_check(launch_problem: str | None) -> DeviceCheck:
    """Only a launch tells whether the harness's developer profile is trusted; informative
    (a denied launch holds the device with that status, and the next launch tells again)."""
    if launch_problem is None:
        return check("developer profile", True, "no launch was denied")
    return check("developer profile", False, launch_problem, FIXES[PROFILE_UNTRUSTED])


async def device_checks(lockdown: LockdownClient, context: CheckContext) -> list[DeviceCheck]:
    checks = [
        check(
            "paired and trusted",
            lockdown.paired,
            "this host holds the phone's pair record" if lockdown.paired else "not paired",
            FIXES[NOT_PAIRED],
        )
    ]
    if not lockdown.paired:
        return checks + await _guarded(_battery_and_space, lockdown, context)
    developer_mode = not lockdown.has_developer_mode or bool(
        await lockdown.get_developer_mode_status()
    )
    checks.append(
        check(
            "developer mode",
            developer_mode,
            "on" if developer_mode else "off",
            FIXES[DEVELOPER_MODE_OFF],
        )
    )
    checks.append(await _screen_lock(lockdown))
    for probe in (_developer_disk_image, _tunnel, _harness, _battery_and_space):
        checks += await _guarded(probe, lockdown, context)
    known = context.thermal_state != ThermalState.unknown
    checks.append(
        check(
            "thermal state",
            context.thermal_state not in HOT if known else None,
            context.thermal_state.value
            if context.thermal_state != ThermalState.unknown
            else "unknown before a run (the harness reports it at each run's start and end)",
            "let it cool down out of its case, away from chargers that heat it",
        )
    )
    return checks


async def _guarded(
    probe: Callable[[LockdownClient, CheckContext], Awaitable[list[DeviceCheck]]],
    lockdown: LockdownClient,
    context: CheckContext,
) -> list[DeviceCheck]:
    name = PROBE_NAMES[probe.__name__]
    try:
        return await probe(lockdown, context)
    except PasswordRequiredError:
        return [check(name, False, "cannot be checked while the phone is locked", FIXES[LOCKED])]
    except (PyMobileDevice3Exception, OSError, ConnectionError) as error:
        return [check(name, False, f"{type(error).__name__}: {error}", "see the agent's log")]


async def _screen_lock(lockdown: LockdownClient) -> DeviceCheck:
    try:
        probe = HouseArrestService(lockdown)
        await probe.connect()
        await probe.close()
    except PasswordRequiredError:
        return check("screen unlocked", False, "locked (passcode required)", FIXES[LOCKED])
    return check("screen unlocked", True, "services start without a passcode")


async def _developer_disk_image(
    lockdown: LockdownClient, context: CheckContext
) -> list[DeviceCheck]:
    version = lockdown.product_version
    personalized = Version(version) >= Version("17.0")
    kind = "personalized" if personalized else "classic"
    if await is_mounted(lockdown):
        return [check("developer disk image", True, f"{kind} image mounted")]
    folder = context.ddi_folder
    fix = FIXES[DDI_NOT_MOUNTED].replace("and run `agent doctor`", "and start the agent")
    if folder is None:
        return [check("developer disk image", False, f"{kind} image not mounted", fix)]
    try:
        found = personalized_image(folder)[0] if personalized else classic_image(folder, version)[0]
    except FileNotFoundError as missing:
        return [check("developer disk image", False, f"not mounted, and {missing}", fix)]
    return [
        check("developer disk image", True, f"not mounted yet; the agent mounts {found} at a run")
    ]


async def _tunnel(lockdown: LockdownClient, context: CheckContext) -> list[DeviceCheck]:
    if Version(lockdown.product_version) < Version("17.0"):
        return []
    from pymobiledevice3.exceptions import TunneldConnectionError
    from pymobiledevice3.tunneld.api import get_tunneld_device_by_udid

    host, port = context.tunneld
    try:
        rsd = await get_tunneld_device_by_udid(str(lockdown.udid), context.tunneld)
    except TunneldConnectionError:
        return [check("tunnel", False, f"no tunneld at {host}:{port}", FIXES[NO_TUNNEL])]
    if rsd is None:
        return [check("tunnel", False, f"tunneld at {host}:{port} has none", FIXES[NO_TUNNEL])]
    with contextlib.suppress(Exception):
        await rsd.close()
    return [check("tunnel", True, f"RemoteServiceDiscovery answers through tunneld {host}:{port}")]


async def _harness(lockdown: LockdownClient, context: CheckContext) -> list[DeviceCheck]:
    async with InstallationProxyService(lockdown) as proxy:
        apps = await proxy.get_apps(application_type="User", bundle_identifiers=[context.bundle_id])
    app = apps.get(context.bundle_id)
    install = "build it from ios_harness/ and give the agent --harness-ipa; it installs it"
    if app is None and context.ipa_version is not None:
        wanted = f"{context.ipa_version[1]} ({context.ipa_version[2]})"
        return [check("harness app", True, f"not installed; the agent installs {wanted} at a run")]
    if app is None:
        return [check("harness app", False, f"{context.bundle_id} is not installed", install)]
    installed = (str(app.get("CFBundleShortVersionString")), str(app.get("CFBundleVersion")))
    protocol = app.get("DecodebenchHarnessProtocol")
    detail = f"{context.bundle_id} {installed[0]} ({installed[1]}), protocol {protocol}"
    if protocol != HARNESS_PROTOCOL_VERSION and context.ipa_version is None:
        return [
            check(
                "harness app",
                False,
                f"{detail}; this agent speaks protocol {HARNESS_PROTOCOL_VERSION}",
                install,
            )
        ]
    if context.ipa_version is not None and installed != context.ipa_version[1:]:
        wanted = f"{context.ipa_version[1]} ({context.ipa_version[2]})"
        return [check("harness app", True, f"{detail}; the agent installs {wanted} over it")]
    return [check("harness app", True, detail)]


async def battery_values(lockdown: LockdownClient) -> dict[str, Any]:
    """DeviceInfo's battery_level and charging, from lockdown."""
    battery = await lockdown.get_value("com.apple.mobile.battery") or {}
    level = battery.get("BatteryCurrentCapacity")
    return {
        "battery_level": int(level) if isinstance(level, int) else None,
        "charging": bool(battery.get("BatteryIsCharging") or battery.get("ExternalConnected")),
    }


async def _battery_and_space(lockdown: LockdownClient, context: CheckContext) -> list[DeviceCheck]:
    values = await battery_values(lockdown)
    level, charging = values["battery_level"], values["charging"]
    battery_ok = charging or (isinstance(level, int) and level >= context.min_battery)
    checks = [
        check(
            "battery",
            battery_ok,
            f"{level}%, {'charging' if charging else 'not charging'}",
            f"plug it into a powered hub (runs need {context.min_battery}% or a charger)",
        )
    ]
    usage: dict[str, Any] = {}
    with contextlib.suppress(PyMobileDevice3Exception):
        usage = await lockdown.get_value("com.apple.disk_usage") or {}
    free = usage.get("AmountDataAvailable")
    if not isinstance(free, int):
        checks.append(check("free space", None, "the phone does not report its free space"))
    elif context.largest_model_bytes is None:
        checks.append(
            check(
                "free space", None, f"{free / 1e9:.1f} GB free; the queue's largest model: unknown"
            )
        )
    else:
        needed = SPACE_FACTOR * context.largest_model_bytes
        checks.append(
            check(
                "free space",
                free >= needed,
                f"{free / 1e9:.1f} GB free, the queue's largest model needs {needed / 1e9:.2f} GB",
                "free space on the phone (Settings > General > iPhone Storage)",
            )
        )
    return checks
