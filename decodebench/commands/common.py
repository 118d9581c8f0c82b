"""What every subcommand shares: the user-facing error, the server options and the one client."""

from __future__ import annotations

import argparse
import os
from typing import Any

DEFAULT_SERVER = "http://127.0.0.1:8000"


class CliError(Exception):
    """A user-facing error: printed as one line, exit code 2."""


def add_server_options(parser: argparse.ArgumentParser) -> None:
    """``--server`` (or DECODEBENCH_SERVER_URL) and ``--token`` (or DECODEBENCH_TOKEN)."""
    parser.add_argument(
        "--server", default=os.environ.get("DECODEBENCH_SERVER_URL", DEFAULT_SERVER)
    )
    parser.add_argument("--token", default=None, help="user API token (or DECODEBENCH_TOKEN)")


def client(args: argparse.Namespace, timeout: float = 30.0) -> Any:
    """A client of ``args.server`` with the user's token; :class:`CliError` without one."""
    from decodebench.client import DecodebenchClient

    token = args.token or os.environ.get("DECODEBENCH_TOKEN")
    if not token:
        raise CliError("no API token: pass --token or set DECODEBENCH_TOKEN")
    return DecodebenchClient(args.server, token, timeout=timeout)


def describe_api_error(error: Any) -> str:
    detail = error.detail
    if isinstance(detail, list):  # FastAPI validation errors: name each field
        parts = []
        for item in detail:
            location = ".".join(str(part) for part in item.get("loc", []) if part != "body")
            parts.append(f"{location}: {item.get('msg')}")
        return "; ".join(parts)
    return f"HTTP {error.status_code}: {detail}"
