"""Serving the app in several processes on one port.

Each process binds its own listening socket to the port with ``SO_REUSEPORT``, so the kernel
spreads new connections across them. uvicorn's own ``workers`` share one socket, and whichever
process's event loop woke first accepted a whole burst of connections: under bench/ingest.py
every one of 50 devices' keep-alive connections landed on one process while the other sat idle,
and agents hold their connection for hours.
"""

from __future__ import annotations

import logging
import multiprocessing
import signal
import socket
import time
from typing import Any

import uvicorn

log = logging.getLogger("server")


APP = "server.app:app"


def uvicorn_settings(no_access_log: bool) -> dict[str, Any]:
    return {
        "log_level": "info",
        "access_log": not no_access_log,
        # Agents keep their connection between a run's renewals; closing it after uvicorn's
        # default 5 s races their next request (a reset connection, a failed request).
        "timeout_keep_alive": 30,
        # A long-poll claim waits up to a minute; on shutdown it is cut after 5 s rather than
        # held to its end. Its agent claims again with the same claim key and gets the same run.
        "timeout_graceful_shutdown": 5,
        # Health probes and benchmarks open many short connections; keep-alive is what agents use.
        "backlog": 2048,
    }


def reuse_port_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    return sock


def serve_one(host: str, port: int, no_access_log: bool) -> None:
    """One server process on its own SO_REUSEPORT socket; SIGTERM shuts it down gracefully."""
    sock = reuse_port_socket(host, port)
    config = uvicorn.Config(APP, **uvicorn_settings(no_access_log))
    try:
        uvicorn.Server(config).run(sockets=[sock])
    except KeyboardInterrupt:  # Ctrl-C reaches every process of the group; already shut down
        pass


class Supervisor:
    """Starts ``workers`` server processes, starts again one that dies, and on SIGTERM or SIGINT
    stops them all (each finishing its requests, as uvicorn's graceful shutdown does)."""

    def __init__(self, host: str, port: int, workers: int, no_access_log: bool) -> None:
        self.args = (host, port, no_access_log)
        self.workers = workers
        self.context = multiprocessing.get_context("spawn")
        self.processes: list[Any] = []
        self.stopping = False

    def start(self) -> Any:
        process = self.context.Process(target=serve_one, args=self.args, name="server-worker")
        process.start()
        return process

    def stop(self, signum: int, frame: object) -> None:
        self.stopping = True

    def run(self) -> None:
        # Bind once here first, so a port in use fails now with a clear message, not N times.
        try:
            reuse_port_socket(self.args[0], self.args[1]).close()
        except OSError as error:
            raise SystemExit(f"cannot listen on {self.args[0]}:{self.args[1]}: {error}") from error
        signal.signal(signal.SIGTERM, self.stop)
        signal.signal(signal.SIGINT, self.stop)
        self.processes = [self.start() for _ in range(self.workers)]
        started = [time.monotonic()] * self.workers
        # Per process, how long one that dies at once (a bad setting, the database away) waits
        # before it is started again: doubling up to 10 s, so not a tight loop of restarts.
        pause = [0.5] * self.workers
        log.warning("serving on %s:%d with %d processes", self.args[0], self.args[1], self.workers)
        while not self.stopping:
            time.sleep(0.5)  # the pause between looks, also how soon a stop is acted on
            for index, process in enumerate(self.processes):
                if process.is_alive() or self.stopping:
                    continue
                lived = time.monotonic() - started[index]
                if lived >= 10:
                    pause[index] = 0.5
                elif lived < pause[index]:
                    continue
                else:
                    pause[index] = min(pause[index] * 2, 10.0)
                log.warning("server process %s exited with %s; starting another",
                            process.pid, process.exitcode)  # fmt: skip
                self.processes[index] = self.start()
                started[index] = time.monotonic()
        for process in self.processes:
            if process.is_alive():
                process.terminate()  # SIGTERM: uvicorn's graceful shutdown
        deadline = time.monotonic() + 15
        for process in self.processes:
            process.join(timeout=max(0.1, deadline - time.monotonic()))
            if process.is_alive():
                process.kill()
                process.join()
