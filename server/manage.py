"""Operator commands: wait for the database, migrate, create tokens, serve."""

from __future__ import annotations

import argparse
import sys
import time

from sqlalchemy import create_engine, text
from sqlalchemy.exc import OperationalError

from server.config import get_settings
from server.models import DEFAULT_SCOPES, Scope, TokenKind


def wait_for_database(timeout_s: float) -> None:
    engine = create_engine(get_settings().database_url)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with engine.connect() as connection:
                connection.execute(text("select 1"))
            return
        except OperationalError as error:
            if time.monotonic() > deadline:
                raise SystemExit(
                    f"database not reachable after {timeout_s:.0f}s: {error}"
                ) from None
            time.sleep(0.5)
        finally:
            engine.dispose()


def migrate(revision: str = "head") -> None:
    from pathlib import Path

    from alembic import command
    from alembic.config import Config

    config = Config(str(Path(__file__).resolve().parent.parent / "alembic.ini"))
    command.upgrade(config, revision)


def create_token_command(
    kind: str,
    name: str,
    token: str | None,
    scopes: tuple[str, ...] = (),
    project: str | None = None,
) -> str:
    from server.auth import create_token
    from server.db import get_sessionmaker

    chosen = tuple(Scope(scope) for scope in scopes) or DEFAULT_SCOPES
    with get_sessionmaker().begin() as session:
        return create_token(session, TokenKind(kind), name, token, chosen, project)


def pin_device_command(udid: str, project: str | None) -> None:
    """Pin a registered device to a project (it then claims only that project's runs and only
    that project sees it), or share it again with ``project=None``."""
    from sqlalchemy import select

    from server import tenancy
    from server.db import get_sessionmaker
    from server.models import Device

    with get_sessionmaker().begin() as session:
        device = session.scalar(select(Device).where(Device.udid == udid).with_for_update())
        if device is None:
            raise ValueError(f"no registered device {udid!r} (its agent must register it first)")
        device.project_id = tenancy.project_named(session, project).id if project else None


def revoke_tokens_command(name: str) -> int:
    """Revoke every live token of that name; returns how many."""
    from sqlalchemy import func, update

    from server.db import get_sessionmaker
    from server.models import ApiToken

    with get_sessionmaker().begin() as session:
        revoked = session.scalars(
            update(ApiToken)
            .where(ApiToken.name == name, ApiToken.revoked_at.is_(None))
            .values(revoked_at=func.now())
            .returning(ApiToken.id)
        ).all()
        return len(revoked)


def prune_uploads_command(idle_hours: float) -> int:
    """Forget uploads left open that long; returns how many."""
    from server.artifacts.store import ArtifactStore
    from server.config import get_settings
    from server.db import get_sessionmaker
    from server.uploads.service import prune_uploads

    with get_sessionmaker().begin() as session:
        store = ArtifactStore(get_settings().artifact_dir)
        return prune_uploads(session, store, idle_hours * 3600)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m server.manage")
    commands = parser.add_subparsers(dest="command", required=True)
    prestart = commands.add_parser("prestart", help="wait for the database, then migrate")
    prestart.add_argument("--timeout", type=float, default=60.0)
    commands.add_parser("migrate", help="alembic upgrade head")
    token = commands.add_parser("create-token", help="create an API token and print it once")
    token.add_argument("--kind", choices=[kind.value for kind in TokenKind], required=True)
    token.add_argument("--name", required=True)
    token.add_argument(
        "--token", help="use this value (at least 16 characters) instead of a random one"
    )
    token.add_argument(
        "--scope",
        action="append",
        choices=[scope.value for scope in Scope],
        default=[],
        help="what a user token may do (repeatable; default: read and submit)",
    )
    token.add_argument(
        "--project",
        help="the project a user token belongs to (created if missing; default: default)",
    )
    pin = commands.add_parser("pin-device", help="make a device claim only one project's runs")
    pin.add_argument("--udid", required=True)
    pin.add_argument("--project", required=True, help="an existing project")
    unpin = commands.add_parser("unpin-device", help="share a pinned device with every project")
    unpin.add_argument("--udid", required=True)
    revoke = commands.add_parser("revoke-token", help="revoke every token with this name")
    revoke.add_argument("--name", required=True)
    prune = commands.add_parser(
        "prune-uploads", help="forget open uploads nobody has written to for a while"
    )
    prune.add_argument("--idle-hours", type=float, default=24.0)
    args = parser.parse_args(argv)

    if args.command == "prestart":
        wait_for_database(args.timeout)
        migrate()
    elif args.command == "migrate":
        migrate()
    elif args.command == "create-token":
        try:
            print(
                create_token_command(
                    args.kind, args.name, args.token, tuple(args.scope), args.project
                )
            )
        except ValueError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
    elif args.command in ("pin-device", "unpin-device"):
        try:
            pin_device_command(args.udid, getattr(args, "project", None))
        except (ValueError, LookupError) as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
    elif args.command == "revoke-token":
        revoked = revoke_tokens_command(args.name)
        print(f"revoked {revoked} token(s) named {args.name}")
        return 0 if revoked else 1
    elif args.command == "prune-uploads":
        print(f"pruned {prune_uploads_command(args.idle_hours)} open upload(s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
