"""``decodebench cure NAME --device D ...``: a doctor job on a server for an uploaded package.

The server's worker diagnoses the package (fp16 headroom by layer and role, the avoidable bytes),
repairs it, proves the repair on the chat prompts against the package's own fp32 run, registers
the repaired package as a model and measures the two in an A/B sweep on the device classes.
Prints the job's page; ``--wait`` follows it and prints what it found, ``--out FILE.zip``
downloads the repaired package. Exit 0 when submitted (with ``--wait``: done), 1 when the
awaited job failed, 2 when it was refused, 3 when waiting timed out. Upload the package first
(``decodebench model upload X.mlpackage --name NAME``); ``decodebench repair`` does the
diagnosis, repair and proof locally.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from decodebench.commands.common import CliError, add_server_options, client, describe_api_error

DEFAULT_DEVICES = ["iphone-16-pro", "iphone-17-pro"]


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "cure",
        help="diagnose, repair, prove and measure an uploaded package on a server",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_server_options(parser)
    parser.add_argument("package", metavar="NAME", help="an uploaded package's model name")
    parser.add_argument("--device", action="append", default=None, help="device class (repeat)")
    parser.add_argument("--tokenizer", default="smollm2-135m", help="or upload:<checkpoint>")
    parser.add_argument("--prompts", type=int, default=30, help="chat prompts (default 30)")
    parser.add_argument("--steps", type=int, default=16, help="greedy tokens (default 16)")
    parser.add_argument("--wait", action="store_true", help="follow the job to its end")
    parser.add_argument("--out", metavar="FILE.zip", help="with --wait: download the repair")
    parser.add_argument("--timeout", type=float, default=4 * 3600)
    parser.set_defaults(handler=cmd_cure)


def cmd_cure(args: argparse.Namespace) -> int:
    from decodebench.client import ApiError

    request = {
        "package": args.package,
        "devices": args.device or DEFAULT_DEVICES,
        "tokenizer": args.tokenizer,
        "prompts": args.prompts,
        "steps": args.steps,
    }
    with client(args) as server:
        try:
            job = server.submit_doctor(request)
        except ApiError as error:
            raise CliError(f"doctor job refused: {describe_api_error(error)}") from None
        print(f"doctor job {job.id}: {server.base_url}/doctor/{job.id}", flush=True)
        if not args.wait:
            return 0
        deadline = time.monotonic() + args.timeout
        last = ""
        while job.state not in ("done", "failed"):
            line = f"{job.state} {job.progress:.0%} {job.stage or ''}".rstrip()
            if line != last:
                print(line, flush=True)
                last = line
            if time.monotonic() > deadline:
                print(f"doctor job {job.id}: still {job.state} after {args.timeout:.0f} s")
                return 3
            time.sleep(2.0)
            job = server.get_doctor(job.id)
        if job.state == "failed":
            print(f"doctor job {job.id} failed: {job.error}")
            return 1
        print(summary(job))
        if args.out:
            server.download_repaired(job.id, Path(args.out))
            print(f"repaired package: {args.out}")
    return 0


def summary(job: Any) -> str:
    """What the job found, in a few lines."""
    report = job.report
    lines = [f"doctor job {job.id}: done; repaired package {job.repaired_model}"]
    if report is not None:
        first = report.headroom.first_non_finite
        lines.append(
            "  first non-finite in fp16: "
            + (f"{first.label} ({first.op_type} '{first.op}')" if first else "none")
        )
        overflows = report.headroom.overflows
        lines.append(f"  ops overflowing fp16: {len(overflows)}")
        repair = report.repair
        lines.append(f"  repairs applied: {', '.join(repair.applied) or 'none'}")
        lines.append(f"  agreement: {repair.result.summary()}")
    if job.sweep_id is not None:
        lines.append(f"  A/B sweep {job.sweep_id}: {job.sweep_state}")
    return "\n".join(lines)
