"""`python -m server`: serve the API and pages with uvicorn, in one or several processes."""

from __future__ import annotations

import argparse

import uvicorn

from server.config import get_settings


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m server")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        help="server processes sharing the port (default DECODEBENCH_WORKERS, 1); the server "
        "keeps no state in memory, so any process may answer any request",
    )
    parser.add_argument(
        "--no-access-log", action="store_true", help="do not log every request (under load)"
    )
    args = parser.parse_args()
    workers = args.workers or get_settings().workers
    uvicorn.run(
        "server.app:app",
        host=args.host,
        port=args.port,
        workers=workers,
        log_level="info",
        access_log=not args.no_access_log,
        # Agents keep their connection between a run's renewals; closing it after uvicorn's
        # default 5 s races their next request (a reset connection, a failed request).
        timeout_keep_alive=30,
        # A long-poll claim waits up to a minute; on shutdown it is cut after 5 s rather than
        # held to its end. Its agent claims again with the same claim key and gets the same run.
        timeout_graceful_shutdown=5,
        # Health probes and benchmarks open many short connections; keep-alive is what agents use.
        backlog=2048,
    )


if __name__ == "__main__":
    main()
