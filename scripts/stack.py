"""Start the service's roles as real processes on one machine: for the demo and end-to-end tests.

Each role is the same command a deployment runs (see docker-compose.yml); only the addresses of
the database and the broker change.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def scratch_database(name: str) -> Iterator[str]:
    """A database created afresh for a benchmark and dropped afterwards; yields its SQLAlchemy
    URL. The server is reached through ``DECODEBENCH_BENCH_ADMIN_URL`` (default: the local
    PostgreSQL as ``postgres``)."""
    import psycopg

    admin = os.environ.get(
        "DECODEBENCH_BENCH_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
    )
    with psycopg.connect(admin, autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        connection.execute(f'CREATE DATABASE "{name}"')
    host = admin.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://")
    try:
        yield f"{host}/{name}"
    finally:
        with psycopg.connect(admin, autocommit=True) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _terminate_with_parent() -> None:
    """Linux: a role process gets SIGTERM when the process that started it dies, however it died,
    so a killed demo or test leaves no server, worker or agent behind."""
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def stop_process_groups(processes: Iterable[subprocess.Popen[bytes]], grace_s: float) -> None:
    """SIGTERM each process's group, wait up to ``grace_s`` for all of them together, then
    SIGKILL the groups still running."""
    processes = list(processes)
    for process in processes:
        if process.poll() is None:
            try:
                os.killpg(process.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + grace_s
    for process in processes:
        try:
            process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


@dataclass
class Stack:
    database_url: str
    broker_url: str
    var_dir: Path
    port: int = field(default_factory=free_port)
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)
    tokens: dict[str, str] = field(default_factory=dict)

    @property
    def server_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self, **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            DECODEBENCH_DATABASE_URL=self.database_url,
            DECODEBENCH_BROKER_URL=self.broker_url,
            DECODEBENCH_BROKER_FOLDER=str(self.var_dir / "broker"),
            DECODEBENCH_ARTIFACT_DIR=str(self.var_dir / "artifacts"),
            DECODEBENCH_SERVER_URL=self.server_url,
            DECODEBENCH_PUBLIC_URL=self.server_url,
            PYTHONPATH=str(ROOT),
            PYTHONUNBUFFERED="1",
        )
        env.update(extra)
        return env

    def manage(self, *args: str) -> str:
        result = subprocess.run(
            [sys.executable, "-m", "server.manage", *args],
            env=self.env(),
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(f"server.manage {' '.join(args)} failed:\n{result.stderr}")
        return result.stdout.strip()

    def prepare(self) -> None:
        """Migrate and mint one token per role."""
        self.var_dir.mkdir(parents=True, exist_ok=True)
        self.manage("prestart", "--timeout", "30")
        for kind, name in (
            ("user", "demo-user"),
            ("worker", "demo-worker"),
            ("agent", "demo-agent"),
        ):
            token = f"dbk_{kind}_{secrets.token_urlsafe(18)}"
            self.tokens[kind] = self.manage(
                "create-token", "--kind", kind, "--name", name, "--token", token
            )

    def _spawn(self, name: str, command: list[str], env: dict[str, str]) -> subprocess.Popen:
        log_path = self.var_dir / f"{name}.log"
        log = log_path.open("ab")
        process = subprocess.Popen(
            command,
            env=env,
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_terminate_with_parent,
        )
        self.processes[name] = process
        return process

    def start_server(self, *args: str, health: int = 200, **settings: str) -> None:
        """``args`` go to `python -m server` (``--workers 2``); ``settings`` are environment.
        Returns once `/api/v1/health` answers ``health`` (503: a server whose database is away)."""
        self._spawn(
            "server",
            [sys.executable, "-m", "server", "--host", "127.0.0.1", "--port", str(self.port),
             *args],
            self.env(**settings),
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            self.check_alive()
            try:
                if httpx.get(f"{self.server_url}/api/v1/health", timeout=2).status_code == health:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.3)
        raise RuntimeError(f"server did not become healthy; see {self.var_dir / 'server.log'}")

    def start_worker(self, name: str = "worker") -> subprocess.Popen:
        command = [
            sys.executable, "-m", "celery", "-A", "worker.app", "worker",
            "--loglevel", "INFO", "--pool", "solo", "--queues", "builds", "--without-heartbeat",
            "--without-gossip", "--without-mingle",
        ]  # fmt: skip
        env = self.env(
            DECODEBENCH_WORKER_TOKEN=self.tokens["worker"],
            DECODEBENCH_WORK_DIR=str(self.var_dir / name),
            DECODEBENCH_WORKER_NAME=name,
        )
        return self._spawn(name, command, env)

    def start_beat(
        self,
        reconcile_interval_s: float = 60.0,
        schedule_tick_interval_s: float | None = None,
        name: str = "beat",
    ) -> None:
        """Celery beat: asks the server every interval to queue again what was lost and to fire
        due nightly schedules. A second one needs another ``name`` (its log and schedule file)."""
        command = [
            sys.executable, "-m", "celery", "-A", "worker.app", "beat", "--loglevel", "INFO",
            "--schedule", str(self.var_dir / f"{name}-schedule"),
        ]  # fmt: skip
        settings = {"DECODEBENCH_RECONCILE_INTERVAL_S": str(reconcile_interval_s)}
        if schedule_tick_interval_s is not None:
            settings["DECODEBENCH_SCHEDULE_TICK_INTERVAL_S"] = str(schedule_tick_interval_s)
        env = self.env(DECODEBENCH_WORKER_TOKEN=self.tokens["worker"], **settings)
        self._spawn(name, command, env)

    def start_agent(self, device_classes: list[str], *extra_args: str, name: str = "agent") -> None:
        """One agent process; give a second one another ``name`` (its log and folder)."""
        command = [
            sys.executable, "-m", "agent",
            "--name", "demo-host" if name == "agent" else f"demo-{name}",
            "--simulated", ",".join(device_classes),
            "--work-dir", str(self.var_dir / name), *extra_args,
        ]  # fmt: skip
        self._spawn(name, command, self.env(DECODEBENCH_AGENT_TOKEN=self.tokens["agent"]))

    def check_alive(self) -> None:
        for name, process in self.processes.items():
            if process.poll() is not None:
                tail = (self.var_dir / f"{name}.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"{name} exited with {process.returncode}:\n{tail}")

    def stop(self) -> None:
        stop_process_groups(self.processes.values(), grace_s=20)
        self.processes.clear()
