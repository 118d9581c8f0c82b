"""`decodebench`: build and analyse variants locally, or submit and follow sweeps on a server."""

from __future__ import annotations

import argparse
import sys

from decodebench import _quiet
from decodebench.commands import (
    analyze,
    build,
    cure,
    diff,
    doctor,
    fold,
    model,
    repair,
    schedule,
    status,
    submit,
    verify,
)
from decodebench.commands.common import CliError

# In the order `decodebench --help` lists them; each module has register(subparsers).
COMMANDS = (
    build,
    analyze,
    diff,
    fold,
    repair,
    doctor,
    model,
    schedule,
    verify,
    submit,
    status,
    cure,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="decodebench", description=__doc__)
    parser.add_argument(
        "-v",
        "--debug",
        action="store_true",
        help="log at DEBUG to stderr, third-party import messages included "
        f"(or {_quiet.LOG_ENV}=debug)",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.register(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    _quiet.configure_cli_logging(_quiet.debug_requested(False))  # before any command's imports
    args = build_parser().parse_args(argv)
    if args.debug:
        _quiet.configure_cli_logging(True)
    try:
        return int(args.handler(args))
    except CliError as error:
        print(f"decodebench: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
