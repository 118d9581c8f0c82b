"""The demo sweep, end to end, on embedded defaults: no system PostgreSQL, Redis or phones needed.

Starts an embedded PostgreSQL (pgserver), a file-system Celery broker, the server, one build
worker and one agent with two simulated iPhones; submits tiny-gqa repeat_kv vs folded on
iPhone 16 Pro and 17 Pro; waits; prints the comparison table and the UI address.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from stack import ROOT, Stack  # noqa: E402

from decodebench.cli import format_comparison, wait_for_sweep  # noqa: E402
from decodebench.client import DecodebenchClient  # noqa: E402

DEMO_SWEEP = {
    "model": "tiny-gqa",
    "variants": [{"attention": "repeat_kv"}, {"attention": "folded"}],
    "devices": ["iphone-16-pro", "iphone-17-pro"],
    "prompts": 30,
    "decode_tokens": 32,
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
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument(
        "--serve", action="store_true", help="keep the server running after the table (Ctrl-C ends)"
    )
    args = parser.parse_args()
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
        stack.start_agent(DEMO_SWEEP["devices"])
        print(
            f"server {stack.server_url}; worker and agent (2 simulated iPhones) started", flush=True
        )
        print(f"logs in {var_dir}", flush=True)
        with DecodebenchClient(stack.server_url, stack.tokens["user"]) as client:
            sweep = client.submit_sweep(DEMO_SWEEP)
            print(f"submitted sweep {sweep.id}", flush=True)
            sweep = wait_for_sweep(client, sweep.id, args.timeout)
        print()
        print(format_comparison(sweep))
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
