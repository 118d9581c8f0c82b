"""``python -m agent doctor``: is every attached iPhone ready for runs, and if not, what to do.

Takes the agent's own flags (driver, usbmux, tunneld, harness .ipa, DDI folder …) and, to size
the queue's largest model, a user token (``--queue-token`` or ``DECODEBENCH_TOKEN``). Prints each
device's checks as ✓ (holds), ✗ (fails, with the fix) or ? (cannot be told); exits 0 when no
check fails on any device, 1 otherwise, 2 when the agent's settings are unusable.
"""

from __future__ import annotations

import argparse
import logging
import os

from agent.config import AgentSettings, settings_from
from agent.drivers.base import DriverError
from agent.drivers.factory import build_driver
from decodebench.client import ApiError, DecodebenchClient
from decodebench.contracts.names import Driver
from decodebench.contracts.protocol import DeviceCheck, DeviceInfo

IPHONE_DRIVERS = {Driver.pymobiledevice3, Driver.emulated}
TERMINAL_SWEEP_STATES = {"completed", "failed", "cancelled"}
MARKS = {True: "✓", False: "✗", None: "?"}
AGENT_TOKEN_UNUSED = "unused-by-doctor"


def largest_queued_model(settings: AgentSettings, token: str | None) -> tuple[int | None, str]:
    """(bytes of the largest built model of unfinished sweeps, or None; why it is unknown)."""
    if not token:
        return None, "no user token to read the queue (--queue-token or DECODEBENCH_TOKEN)"
    try:
        with DecodebenchClient(settings.server_url, token, timeout=10) as client:
            largest = 0
            for sweep in client.list_sweeps():
                if sweep.state in TERMINAL_SWEEP_STATES:
                    continue
                for build in client.get_sweep(sweep.id).builds:
                    if build.artifact_sha256:
                        report = client.get_build(build.id).report
                        if report is not None:
                            largest = max(largest, report.analysis.weight_file_bytes)
    except (ApiError, OSError, KeyError, ValueError) as error:
        return None, f"the server at {settings.server_url} cannot tell: {error}"
    return largest, ""


def render(device: DeviceInfo, checks: list[DeviceCheck]) -> list[str]:
    lines = [f"{device.device_class} {device.product_type} {device.udid} (iOS {device.os_version})"]
    for item in checks:
        lines.append(f"  {MARKS[item.ok]} {item.name}: {item.detail}")
        if item.ok is False and item.fix:
            lines.append(f"      fix: {item.fix}")
    return lines


DESCRIPTION = (
    "decodebench agent doctor: is every attached iPhone ready for runs, and if not, what to do. "
    "Takes the agent's own flags; prints each device's checks as ✓ (holds), ✗ (fails, with "
    "the fix) or ? (cannot be told), and exits 0 when no check fails on any device, 1 "
    "otherwise, 2 when the agent's settings are unusable."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The doctor's flags besides the agent's own."""
    parser.add_argument(
        "--queue-token",
        default=os.environ.get("DECODEBENCH_TOKEN"),
        help="a user token, to size the queue's largest model (env DECODEBENCH_TOKEN)",
    )


def run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """The doctor, with the agent's flags and its own parsed by ``parser`` into ``args``."""
    if getattr(args, "token", None) is None:  # the doctor claims nothing: any token will do
        args.token = os.environ.get("DECODEBENCH_AGENT_TOKEN") or AGENT_TOKEN_UNUSED
    settings = settings_from(parser, args)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if settings.driver not in IPHONE_DRIVERS:
        print(
            f"doctor checks iPhones: use --driver pymobiledevice3 (or emulated), not {settings.driver}"
        )
        return 2
    try:
        driver = build_driver(settings)
    except Exception as error:
        print(f"✗ cannot start the {settings.driver} driver: {error}")
        return 2
    try:
        return _examine(driver, settings, args.queue_token)
    finally:
        driver.close()


def _examine(driver: object, settings: AgentSettings, queue_token: str | None) -> int:
    from agent.drivers.ios.driver import Pymobiledevice3Driver

    assert isinstance(driver, Pymobiledevice3Driver)
    devices = driver.discover()
    if not devices:
        print("✗ no iPhone is attached: plug it in and check `pymobiledevice3 usbmux list`")
        return 1
    largest, unknown = largest_queued_model(settings, queue_token)
    all_ready = True
    for device in devices:
        try:
            checks = driver.checks(device, largest)
        except DriverError as error:
            checks = [
                DeviceCheck(
                    name="reachable",
                    ok=False,
                    detail=str(error)[:512],
                    fix="check the cable and that the phone shows in `pymobiledevice3 usbmux list`",
                )
            ]
        if largest is None:
            checks = [
                item.model_copy(update={"detail": f"{item.detail}: {unknown}"})
                if item.name == "free space"
                else item
                for item in checks
            ]
        all_ready &= all(item.ok is not False for item in checks)
        print("\n".join(render(device, checks)), flush=True)
    print("all devices ready" if all_ready else "some devices are not ready: apply the fixes above")
    return 0 if all_ready else 1
