"""``decodebench schedule create|list|pause|resume|run-now``: nightly sweeps on a server.

A schedule runs a sweep spec at each due time of a cron expression (read in a time zone), keeps
one series of nightly decode tok/s per variant x device class, re-runs a suspected change on the
same builds and reports confirmed regressions and improvements (GET /api/v1/alerts, and the
schedule's signed webhook). Exit status 0, or 2 on bad input or a server error.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from decodebench.commands.common import CliError, add_server_options, client


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "schedule",
        help="manage nightly schedules",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_server_options(parser)
    actions = parser.add_subparsers(dest="action", required=True)
    create = actions.add_parser("create", help="create a schedule from a sweep spec")
    create.add_argument("name")
    create.add_argument("--spec", required=True, help="sweep spec JSON file")
    create.add_argument("--cron", required=True, help='e.g. "0 2 * * *" (02:00 every night)')
    create.add_argument("--timezone", default="UTC", help="IANA zone, e.g. Europe/Paris")
    create.add_argument("--min-effect", type=float, default=None, help="0.02 = 2%% (default)")
    create.add_argument("--webhook-url", default=None)
    create.add_argument("--webhook-secret", default=None, help="or DECODEBENCH_WEBHOOK_SECRET")
    actions.add_parser("list", help="list schedules")
    for action in ("pause", "resume", "run-now"):
        actions.add_parser(action, help=f"{action} a schedule").add_argument("id", type=int)
    parser.set_defaults(handler=cmd_schedule)


def _create_request(args: argparse.Namespace) -> dict[str, Any]:
    try:
        spec = json.loads(Path(args.spec).read_text())
    except (OSError, ValueError) as error:
        raise ValueError(f"--spec: {error}") from None
    request = {"name": args.name, "spec": spec, "cron": args.cron, "timezone": args.timezone}
    secret = args.webhook_secret or os.environ.get("DECODEBENCH_WEBHOOK_SECRET")
    optional = {"min_effect": args.min_effect, "webhook_url": args.webhook_url,
                "webhook_secret": secret}  # fmt: skip
    return {**request, **{key: value for key, value in optional.items() if value is not None}}


def _line(schedule: Any) -> str:
    state = "enabled" if schedule.enabled else "paused"
    due = schedule.next_due_at.isoformat() if schedule.next_due_at else "-"
    return (
        f"{schedule.id:>4}  {schedule.name:<24} {schedule.cron:<14} {schedule.timezone:<16} "
        f"{state:<8} next {due}  min effect {schedule.min_effect:.1%}  owner {schedule.owner}"
    )


def cmd_schedule(args: argparse.Namespace) -> int:
    from decodebench.client import ApiError

    try:
        with client(args) as server:
            if args.action == "create":
                print(_line(server.create_schedule(_create_request(args))))
            elif args.action == "list":
                for schedule in server.list_schedules():
                    print(_line(schedule))
            elif args.action in ("pause", "resume"):
                print(_line(server.set_schedule_paused(args.id, args.action == "pause")))
            else:
                firing = server.run_schedule_now(args.id)
                print(f"fired schedule {args.id}: sweep {firing.sweep_id} (firing {firing.id})")
    except (ApiError, ValueError) as error:
        raise CliError(f"schedule {args.action}: {error}") from None
    return 0
