"""``python -m agent``: the agent's command line.

Without a command the agent serves its devices (agent/main.py) until stopped; ``doctor`` checks
that each attached iPhone is ready for runs (agent/doctor.py). Each has its own ``--help``.
"""

from __future__ import annotations

import argparse
import functools
import logging
import signal
from collections.abc import Sequence
from types import FrameType

from agent import doctor
from agent.config import add_settings_arguments, build_parser, settings_from
from agent.main import Agent, build_driver
from decodebench._quiet import route_import_noise
from decodebench.client import DecodebenchClient

log = logging.getLogger("agent")


def command_line() -> argparse.ArgumentParser:
    """The agent's flags, and a parser of its own for each command."""
    parser = build_parser()
    parser.set_defaults(command=functools.partial(serve, parser))
    commands = parser.add_subparsers(title="commands", metavar="{doctor}")
    checks = commands.add_parser(
        "doctor",
        prog=f"{parser.prog} doctor",
        help="check that every attached iPhone is ready for runs, and say how to fix it if not",
        description=doctor.DESCRIPTION,
    )
    # Left out when not given after `doctor`, so they do not hide the same flags given before.
    add_settings_arguments(checks, default=argparse.SUPPRESS)
    doctor.add_arguments(checks)
    checks.set_defaults(command=functools.partial(doctor.run, checks))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    route_import_noise()  # coremltools' import chatter, when a driver loads it, goes to DEBUG
    args = command_line().parse_args(argv)
    return int(args.command(args))


def serve(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """Serve the devices until stopped (SIGTERM, SIGINT, or --once and --max-idle-seconds)."""
    settings = settings_from(parser, args)
    logging.basicConfig(
        level=settings.log_level,
        format="%(asctime)s %(levelname)-7s %(threadName)s %(name)s: %(message)s",
    )
    if settings.log_level != "DEBUG":
        logging.getLogger("httpx").setLevel(logging.WARNING)  # it logs every request at INFO
    settings.work_dir.mkdir(parents=True, exist_ok=True)
    try:
        driver = build_driver(settings)
    except Exception as error:
        log.error("cannot start the %s driver: %s", settings.driver, error)
        return 2
    log.info(
        "agent %s starting: server %s, %s driver, devices %s, work dir %s",
        settings.name,
        settings.server_url,
        driver.name,
        ", ".join(f"{d.device_class} {d.udid}" for d in driver.discover()),
        settings.work_dir,
    )
    devices = len(driver.discover())
    with DecodebenchClient(
        settings.server_url,
        settings.api_token,
        # A long poll (on a batch's claims client, which takes this timeout too) may last
        # claim_wait_s; lease renewals and failure reports may overlap, for every device.
        timeout=max(30.0, settings.claim_wait_s + 15.0),
        max_connections=max(100, 2 * devices + 8),
    ) as client:
        agent = Agent(settings, client, driver)

        def on_signal(signum: int, frame: FrameType | None) -> None:
            agent.request_stop(f"received {signal.Signals(signum).name}")

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        try:
            return agent.run()
        finally:
            driver.close()
