"""`python -m server --workers 2` as a real process tree: each server process listens on the
port itself (SO_REUSEPORT), connections reach both, and one killed with SIGKILL is replaced."""

from __future__ import annotations

import os
import signal
import time

import httpx
import psutil

from tests.support.services import DATABASE_URL, REDIS_URL


def _listeners(supervisor: psutil.Process, port: int) -> set[int]:
    found = set()
    for child in supervisor.children(recursive=True):
        try:
            sockets = child.net_connections(kind="tcp")
        except psutil.NoSuchProcess:
            continue
        if any(s.status == psutil.CONN_LISTEN and s.laddr.port == port for s in sockets):
            found.add(child.pid)
    return found


def _established(pid: int, port: int) -> int:
    sockets = psutil.Process(pid).net_connections(kind="tcp")
    return sum(1 for s in sockets if s.status == psutil.CONN_ESTABLISHED and s.laddr.port == port)


def test_server_processes_share_the_port_and_one_that_dies_is_replaced(db: None, tmp_path) -> None:
    from scripts.stack import Stack

    running = Stack(database_url=DATABASE_URL, broker_url=REDIS_URL, var_dir=tmp_path / "var")
    running.var_dir.mkdir(parents=True)
    running.start_server("--workers", "2", "--no-access-log")
    clients = [httpx.Client(base_url=running.server_url, timeout=10) for _ in range(40)]
    try:
        supervisor = psutil.Process(running.processes["server"].pid)
        deadline = time.monotonic() + 30
        while len(processes := _listeners(supervisor, running.port)) < 2:
            assert time.monotonic() < deadline, "two server processes did not start listening"
            time.sleep(0.2)
        assert len(processes) == 2  # each its own listening socket on the one port

        for client in clients:  # 40 keep-alive connections, as 40 devices hold them
            assert client.get("/api/v1/health").status_code == 200
        spread = {pid: _established(pid, running.port) for pid in processes}
        assert sum(spread.values()) == 40
        assert min(spread.values()) >= 5, spread  # the kernel spread them (about 20 each)

        victim = min(processes)
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while True:
            now_listening = _listeners(supervisor, running.port)
            if len(now_listening) == 2 and victim not in now_listening:
                break
            assert time.monotonic() < deadline, f"no process replaced {victim}: {now_listening}"
            time.sleep(0.2)
        for _ in range(10):  # new connections are answered, whichever process takes them
            assert httpx.get(f"{running.server_url}/api/v1/health").status_code == 200
        assert "starting another" in (running.var_dir / "server.log").read_text()
    finally:
        for client in clients:
            client.close()
        running.stop()
