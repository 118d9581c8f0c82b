"""`python -m server`: serve the API and pages with uvicorn, in one or several processes
(several: server/serving.py, one SO_REUSEPORT socket each)."""

from __future__ import annotations

import argparse
import logging

import uvicorn

from server.config import get_settings
from server.serving import APP, Supervisor, uvicorn_settings


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m server")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        help="server processes on the port (default DECODEBENCH_WORKERS, 1); the server keeps "
        "no state in memory, so any process may answer any request",
    )
    parser.add_argument(
        "--no-access-log", action="store_true", help="do not log every request (under load)"
    )
    args = parser.parse_args()
    workers = args.workers or get_settings().workers
    if workers <= 1:
        uvicorn.run(APP, host=args.host, port=args.port, **uvicorn_settings(args.no_access_log))
        return
    logging.basicConfig(level=logging.INFO, format="%(levelname)s:     %(message)s")
    Supervisor(args.host, args.port, workers, args.no_access_log).run()


if __name__ == "__main__":
    main()
