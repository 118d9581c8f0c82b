"""``decodebench submit [--spec FILE | --model M --attention A --device D ...]``: run a sweep.

Submits a sweep spec (a JSON file, or one built from the flags: by default repeat_kv and folded
on iPhone 16 Pro and 17 Pro) to a server and prints its page. ``--wait`` follows the builds and
runs and prints the comparison table. With ``--baseline`` or ``--fail-on-regression`` it is a CI
gate: exit 0 pass, 1 regression, 2 error or bad input, 3 timed out; otherwise exit 0, 1 when the
awaited sweep failed, 2 when it was rejected.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from decodebench.commands import gate
from decodebench.commands.common import CliError, add_server_options, client, describe_api_error
from decodebench.commands.status import format_comparison, with_answers
from decodebench.contracts.api import SweepDetail
from decodebench.contracts.names import TERMINAL_RUN_STATES, BuildState, SweepState

DEFAULT_ATTENTION = ["repeat_kv", "folded"]
DEFAULT_DEVICES = ["iphone-16-pro", "iphone-17-pro"]


def register(subparsers: Any) -> None:
    submit = subparsers.add_parser(
        "submit",
        help="submit a sweep to a server",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_server_options(submit)
    submit.add_argument("--spec", help="a sweep spec JSON file (overrides the flags below)")
    submit.add_argument("--model", default="tiny-gqa")
    submit.add_argument("--attention", action="append", default=None)
    submit.add_argument("--device", action="append", default=None)
    submit.add_argument("--prompts", type=int, default=30)
    submit.add_argument("--decode-tokens", type=int, default=32)
    submit.add_argument("--wait", action="store_true", help="follow progress, print the table")
    submit.add_argument("--timeout", type=float, default=3600)
    gate.add_gate_options(submit)
    submit.set_defaults(handler=cmd_submit)


def _spec(args: argparse.Namespace) -> Any:
    """The spec file as read (the server validates it), or the spec the flags describe."""
    if args.spec:
        try:
            return json.loads(Path(args.spec).read_text())
        except (OSError, json.JSONDecodeError) as error:
            raise CliError(f"cannot read sweep spec {args.spec}: {error}") from None
    return {
        "model": args.model,
        "variants": [{"attention": attention} for attention in args.attention or DEFAULT_ATTENTION],
        "devices": args.device or DEFAULT_DEVICES,
        "prompts": args.prompts,
        "decode_tokens": args.decode_tokens,
    }


def cmd_submit(args: argparse.Namespace) -> int:
    from decodebench.client import ApiError

    spec = _spec(args)
    if gate.gating(args):
        return _submit_and_gate(args, spec)
    with client(args) as server:
        try:
            sweep = server.submit_sweep(spec)
        except ApiError as error:
            raise CliError(f"sweep rejected: {describe_api_error(error)}") from None
        print(f"submitted sweep {sweep.id}: {server.base_url}/sweeps/{sweep.id}")
        if args.wait:
            sweep = wait_for_sweep(server, sweep.id, args.timeout)
            print(with_answers(sweep))
            return 0 if sweep.state == SweepState.completed else 1
    return 0


def _submit_and_gate(args: argparse.Namespace, spec: Any) -> int:
    """Submit, wait, judge against the baseline, publish: exit 0 pass, 1 regression, 2 error or
    bad input, 3 timed out."""
    from decodebench.client import ApiError

    try:
        baseline, min_effect = gate.prepare_spec(spec, args)
    except gate.GateInputError as error:
        return gate.publish(gate.decide([], args, error=str(error)), args)
    with client(args) as server:
        try:
            sweep = server.submit_sweep(spec)
            print(
                f"submitted sweep {sweep.id}: {server.base_url}/sweeps/{sweep.id}", file=sys.stderr
            )
            try:
                sweep = wait_for_sweep(server, sweep.id, args.timeout)
            except CliError:
                return gate.publish(gate.decide([], args, timed_out=True), args)
            if sweep.state != SweepState.completed:
                failed = [run.failure_reason for run in sweep.runs if run.failure_reason]
                message = f"sweep {sweep.id} {sweep.state}: {'; '.join(failed[:3])}"
                return gate.publish(gate.decide([], args, error=message), args)
            verdicts = server.get_verdicts(sweep.id, baseline.sweep_id, min_effect)
        except ApiError as error:
            return gate.publish(gate.decide([], args, error=describe_api_error(error)), args)
    print(format_comparison(sweep), file=sys.stderr)
    if verdicts.note:
        print(f"verdicts: {verdicts.note}", file=sys.stderr)
    return gate.publish(gate.decide(verdicts.verdicts, args), args)


def wait_for_sweep(server: Any, sweep_id: int, timeout_s: float) -> SweepDetail:
    """Poll the sweep each second, printing its progress line when it changes, until it ends;
    :class:`CliError` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    last_line = ""
    while True:
        sweep = server.get_sweep(sweep_id)
        line = progress_line(sweep)
        if line != last_line:
            print(line, file=sys.stderr, flush=True)
            last_line = line
        if sweep.state in (SweepState.completed, SweepState.failed):
            return sweep
        if time.monotonic() > deadline:
            raise CliError(f"sweep {sweep_id} still {sweep.state} after {timeout_s:.0f}s")
        time.sleep(1.0)


def progress_line(sweep: SweepDetail) -> str:
    builds = ", ".join(
        f"{build.label}: {build.state}"
        + (
            f" {build.stage} {build.progress * 100:.0f}%"
            if build.state == BuildState.building
            else ""
        )
        for build in sweep.builds
    )
    done = sum(run.state in TERMINAL_RUN_STATES for run in sweep.runs)
    return f"sweep {sweep.id} {sweep.state}: builds [{builds}]; runs {done}/{len(sweep.runs)} done"
