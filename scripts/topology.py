"""The farm as separate hosts on one Linux machine: network namespaces joined by veth links.

    sudo python -m scripts.topology up        # five hosts, every role started, tokens printed
    sudo python -m scripts.topology sweep     # a sweep of two variants on both labs, with figures
    sudo python -m scripts.topology down      # kill every process, delete every namespace

Hosts (namespace ``<prefix>-<host>``, address ``<subnet>.N``): ``db`` (its own PostgreSQL
cluster and redis-server), ``server`` (`python -m server --workers 2`, and Celery beat),
``builder`` (a Celery worker), ``lab1`` and ``lab2`` (one agent each with emulated iPhones,
their usbmuxd on the lab's own loopback). Start order: db, server (migrate, tokens), builders,
beat, labs. Each host's veth joins a bridge in the machine's own namespace, which plays the
operator's desk: it reaches the server's API and, for checks, the database. Each host has its
own root directory (``<root>/<host>``: home, temporary files, work folders, logs), its own
hostname and its own loopback, so a role that reads another's files or dials 127.0.0.1 for
another role fails here. Taking a host's link down (`cut`) is a network partition: its
processes keep running.

Needs root and `ip` (iproute2). Teardown is idempotent: `down` kills what runs in the
namespaces (by their process ids, as `ip netns pids` lists them), even after a crash, then
deletes the namespaces, the links and the bridge.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scripts.stack import stop_process_groups

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_ROOT = Path("/tmp/decodebench-topology")
DEFAULT_PREFIX = "dbt"
DEFAULT_SUBNET = "10.77.0"
SERVER_PORT = 8000
DEVICES = ("iphone-16-pro", "iphone-17-pro")

# Two variants on both labs, as fast as the end-to-end tests make them.
SWEEP: dict[str, Any] = {
    "model": "tiny-gqa",
    "variants": [
        {"attention": "repeat_kv", "context": 128},
        {"attention": "folded", "context": 128},
    ],
    "devices": list(DEVICES),
    "prompts": 3,
    "decode_tokens": 4,
    "repetitions": 2,
}


# The roles in the order `up` starts them: docker-compose.yml's depends_on and the operator
# guide's "Deploying the roles" keep it (tests/scripts/test_compose.py).
START_ORDER = ("postgres", "redis", "server", "worker", "beat", "agent")
HOST_OF_ROLE = {
    "postgres": "db",
    "redis": "db",
    "server": "server",
    "worker": "builder",
    "beat": "server",
    "agent": "lab1",
}
# Settings the topology passes to make a role quick or to name it, not what it needs to run.
TUNING = {"DECODEBENCH_RECONCILE_INTERVAL_S"}

SHIFTED_CLOCK = """\
# This host's wall clock, {offset:+g} s off (scripts/topology.py clock_offsets_s).
import datetime as _datetime
import time as _time

_OFFSET = {offset!r}
_time_time, _time_time_ns = _time.time, _time.time_ns
_time.time = lambda: _time_time() + _OFFSET
_time.time_ns = lambda: _time_time_ns() + int(_OFFSET * 1e9)


class _ShiftedDatetime(_datetime.datetime):
    @classmethod
    def now(cls, tz=None):
        return super().now(tz) + _datetime.timedelta(seconds=_OFFSET)

    @classmethod
    def utcnow(cls):
        return super().utcnow() + _datetime.timedelta(seconds=_OFFSET)


_datetime.datetime = _ShiftedDatetime
"""


def _pg_bin() -> Path:
    """The newest installed PostgreSQL's binaries (Debian layout), else the ones on PATH."""
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: int(p.parent.name))
    if versions:
        return versions[-1]
    initdb = shutil.which("initdb")
    if initdb is None:
        raise SystemExit("PostgreSQL's initdb was not found")
    return Path(initdb).parent


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {result.stderr.strip()}")
    return result


def available() -> str | None:
    """Why the topology cannot be built here, or None when it can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "iproute2's ip is not installed"
    if _ip("netns", "list", check=False).returncode != 0:
        return "ip netns does not work here"
    if shutil.which("redis-server") is None:
        return "redis-server is not installed"
    return None


@dataclass
class Host:
    name: str
    address: str
    namespace: str
    link: str  # the veth end on the bridge (in the machine's namespace)
    root: Path


@dataclass
class Topology:
    root: Path = DEFAULT_ROOT
    prefix: str = DEFAULT_PREFIX
    subnet: str = DEFAULT_SUBNET
    # each lab host and the device classes of its emulated iPhones
    labs: dict[str, tuple[str, ...]] = field(
        default_factory=lambda: {"lab1": DEVICES, "lab2": DEVICES}
    )
    builders: tuple[str, ...] = ("builder",)
    # DECODEBENCH_* settings of the server processes (short leases for the partition tests)
    server_settings: dict[str, str] = field(default_factory=dict)
    agent_args: tuple[str, ...] = ()
    reconcile_interval_s: float = 60.0
    # hosts whose processes read a wall clock this many seconds off (their time.time and
    # datetime.now, through a sitecustomize on the host's PYTHONPATH): the kernel's clock is one
    # for every namespace, and a time namespace moves only the monotonic clocks
    clock_offsets_s: dict[str, float] = field(default_factory=dict)
    # tests: role processes get SIGTERM when the process that started them dies
    attached: bool = False
    tokens: dict[str, str] = field(default_factory=dict)
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    # -- the hosts and their links -------------------------------------------------------------

    @property
    def bridge(self) -> str:
        return f"{self.prefix}-br"

    @property
    def hosts(self) -> dict[str, Host]:
        names = ["db", "server", *self.builders, *self.labs]
        numbers = {"db": 10, "server": 20}
        numbers.update({name: 30 + i for i, name in enumerate(self.builders)})
        numbers.update({name: 40 + i for i, name in enumerate(self.labs)})
        return {
            name: Host(
                name=name,
                address=f"{self.subnet}.{numbers[name]}",
                namespace=f"{self.prefix}-{name}",
                link=f"{self.prefix}-{name}"[:15],
                root=self.root / name,
            )
            for name in names
        }

    @property
    def server_url(self) -> str:
        return f"http://{self.hosts['server'].address}:{SERVER_PORT}"

    @property
    def database_url(self) -> str:
        return f"postgresql+psycopg://postgres@{self.hosts['db'].address}:5432/decodebench"

    @property
    def broker_url(self) -> str:
        return f"redis://{self.hosts['db'].address}:6379/0"

    def network(self) -> None:
        """A bridge in this namespace (the operator's desk at ``<subnet>.1``) and, per host, a
        namespace whose ``eth0`` is one end of a veth pair, the other end on the bridge."""
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.subnet}.1/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for host in self.hosts.values():
            _ip("netns", "add", host.namespace)
            _ip("link", "add", host.link, "type", "veth", "peer", "name", "eth0",
                "netns", host.namespace)  # fmt: skip
            _ip("link", "set", host.link, "master", self.bridge)
            _ip("link", "set", host.link, "up")
            inside = ("netns", "exec", host.namespace, "ip")
            _ip(*inside, "addr", "add", f"{host.address}/24", "dev", "eth0")
            _ip(*inside, "link", "set", "eth0", "up")
            _ip(
                *inside, "link", "set", "lo", "up"
            )  # each host's own loopback (its phones' usbmuxd)

    def cut(self, host: str) -> None:
        """A network partition: the host's link goes down, its processes keep running."""
        _ip("link", "set", self.hosts[host].link, "down")

    def mend(self, host: str) -> None:
        _ip("link", "set", self.hosts[host].link, "up")

    # -- processes -----------------------------------------------------------------------------

    def env(self, host: str, **settings: str) -> dict[str, str]:
        """A host's environment: nothing inherited but PATH and the locale, its own home and
        temporary folder, and the settings its role is given."""
        root = self.hosts[host].root
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "LANG": os.environ.get("LANG", "C.UTF-8"),
            "HOME": str(root / "home"),
            "TMPDIR": str(root / "tmp"),
            "PYTHONPATH": str(ROOT),
            "PYTHONUNBUFFERED": "1",
        }
        offset = self.clock_offsets_s.get(host)
        if offset:
            clock = root / "clock"
            clock.mkdir(parents=True, exist_ok=True)
            (clock / "sitecustomize.py").write_text(SHIFTED_CLOCK.format(offset=float(offset)))
            env["PYTHONPATH"] = f"{clock}{os.pathsep}{ROOT}"
        env.update(settings)
        return env

    def _on(self, host: str, user: str | None) -> list[str]:
        """A command's prefix: into the host's network namespace and a UTS namespace of its own,
        where the hostname is the host's name (a worker names itself after it), as ``user``."""
        prefix = ["ip", "netns", "exec", self.hosts[host].namespace, "unshare", "--uts", "--",
                  "sh", "-c", 'hostname "$0" && exec "$@"', host]  # fmt: skip
        if user:
            prefix += ["runuser", "-u", user, "--"]
        return prefix

    def _spawn(
        self, host: str, name: str, command: list[str], env: dict[str, str], user: str | None = None
    ) -> subprocess.Popen[bytes]:
        where = self.hosts[host]
        log = (where.root / "logs" / f"{name}.log").open("ab")
        prefix = self._on(host, user)
        process = subprocess.Popen(
            [*prefix, *command],
            env=env,
            cwd=where.root,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_terminate_with_parent if self.attached else None,
        )
        self.processes[f"{host}/{name}"] = process
        return process

    def run_on(
        self, host: str, command: list[str], env: dict[str, str] | None = None, user: str = ""
    ) -> str:
        """A command on a host, to its end; its output, or an error with it."""
        prefix = self._on(host, user)
        result = subprocess.run(
            [*prefix, *command],
            env=env or self.env(host),
            cwd=self.hosts[host].root,
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(f"{host}: {' '.join(command)} failed:\n{result.stderr[-3000:]}")
        return result.stdout.strip()

    def log(self, host: str, name: str) -> str:
        path = self.hosts[host].root / "logs" / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def check_alive(self) -> None:
        for key, process in self.processes.items():
            if process.poll() is not None:
                host, name = key.split("/")
                raise RuntimeError(
                    f"{key} exited with {process.returncode}:\n{self.log(host, name)[-3000:]}"
                )

    # -- the roles -----------------------------------------------------------------------------

    def _folders(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o755)  # the db host's postgres user walks to its cluster
        for host in self.hosts.values():
            for folder in ("home", "tmp", "logs"):
                (host.root / folder).mkdir(parents=True, exist_ok=True)
            host.root.chmod(0o755)

    def start_database(self) -> None:
        """Its own PostgreSQL cluster (initdb as postgres into the db host's folder, listening on
        the host's address only) and its own redis-server."""
        db = self.hosts["db"]
        pgdata, sockets = db.root / "pgdata", db.root / "run"
        for folder in (pgdata, sockets, db.root / "logs"):
            folder.mkdir(parents=True, exist_ok=True)
            shutil.chown(folder, "postgres", "postgres")
        pg = _pg_bin()
        self.run_on(
            "db",
            [str(pg / "initdb"), "-D", str(pgdata), "-U", "postgres", "--auth=trust", "-E",
             "UTF8", "--no-sync"],
            env=self.env("db", HOME=str(pgdata)),
            user="postgres",
        )  # fmt: skip
        with (pgdata / "pg_hba.conf").open("a") as hba:
            hba.write(f"host all all {self.subnet}.0/24 trust\n")
        self._spawn(
            "db",
            "postgres",
            [str(pg / "postgres"), "-D", str(pgdata), "-k", str(sockets), "-p", "5432",
             "-c", f"listen_addresses={db.address}", "-c", "fsync=off",
             "-c", "synchronous_commit=off", "-c", "full_page_writes=off"],
            self.env("db", HOME=str(pgdata)),
            user="postgres",
        )  # fmt: skip
        (db.root / "redis").mkdir(exist_ok=True)
        self._spawn(
            "db",
            "redis",
            ["redis-server", "--bind", db.address, "--port", "6379", "--save", "",
             "--appendonly", "no", "--protected-mode", "no", "--dir", str(db.root / "redis")],
            self.env("db"),
        )  # fmt: skip
        self._wait(
            lambda: subprocess.run(
                ["ip", "netns", "exec", db.namespace, str(pg / "pg_isready"), "-h", db.address, "-U", "postgres",
                 "-q"], check=False,
            ).returncode == 0,
            "PostgreSQL on the db host",
        )  # fmt: skip
        self.run_on("db", [str(pg / "createdb"), "-h", db.address, "-U", "postgres", "decodebench"])

    def server_env(self, **extra: str) -> dict[str, str]:
        server = self.hosts["server"]
        settings = {
            "DECODEBENCH_DATABASE_URL": self.database_url,
            "DECODEBENCH_BROKER_URL": self.broker_url,
            "DECODEBENCH_ARTIFACT_DIR": str(server.root / "artifacts"),
            "DECODEBENCH_PUBLIC_URL": self.server_url,
            "DECODEBENCH_WORKERS": "2",
            **self.server_settings,
            **extra,
        }
        return self.env("server", **settings)

    def prepare(self) -> None:
        """On the server host: wait for the database, migrate, mint one token per host."""
        manage = [sys.executable, "-m", "server.manage"]
        self.run_on("server", [*manage, "prestart", "--timeout", "60"], self.server_env())
        wanted = [("user", "operator")]
        wanted += [("worker", name) for name in (*self.builders, "beat")]
        wanted += [("agent", name) for name in self.labs]
        for kind, name in wanted:
            token = f"dbk_{kind}_{secrets.token_urlsafe(18)}"
            self.tokens[name] = self.run_on(
                "server",
                [*manage, "create-token", "--kind", kind, "--name", name, "--token", token]
                + (["--scope", "read", "--scope", "submit", "--scope", "admin"]
                   if kind == "user" else []),
                self.server_env(),
            )  # fmt: skip

    def start_server(self) -> None:
        """Two server processes on one port of the server host."""
        self._spawn(
            "server",
            "server",
            [sys.executable, "-m", "server", "--host", self.hosts["server"].address,
             "--port", str(SERVER_PORT)],
            self.server_env(),
        )  # fmt: skip
        self._wait(lambda: self.health() == 200, "the server's /api/v1/health")

    def health(self, timeout_s: float = 2.0) -> int | None:
        import httpx

        try:
            return httpx.get(f"{self.server_url}/api/v1/health", timeout=timeout_s).status_code
        except httpx.HTTPError:
            return None

    def worker_env(self, host: str, name: str) -> dict[str, str]:
        """A build worker's (beat's too, without a work folder): the broker, the server's URL
        and a worker token; no database."""
        settings = {
            "DECODEBENCH_BROKER_URL": self.broker_url,
            "DECODEBENCH_SERVER_URL": self.server_url,
            "DECODEBENCH_WORKER_TOKEN": self.tokens[name],
            "DECODEBENCH_RECONCILE_INTERVAL_S": str(self.reconcile_interval_s),
        }
        if name != "beat":
            settings["DECODEBENCH_WORK_DIR"] = str(self.hosts[host].root / "work")
        return self.env(host, **settings)

    def start_builder(self, builder: str) -> None:
        """A Celery worker, one build at a time; it also runs beat's reconcile messages."""
        self._spawn(
            builder,
            "worker",
            [sys.executable, "-m", "celery", "-A", "worker.app", "worker", "--loglevel", "INFO",
             "--pool", "solo", "--queues", "builds", "--without-heartbeat", "--without-gossip",
             "--without-mingle", "--hostname", "worker@%h"],
            self.worker_env(builder, builder),
        )  # fmt: skip

    def start_beat(self) -> None:
        """Beat, one per farm, on the server host: it only sends (reconcile, schedule ticks) to
        the broker, and a builder cut off from the network must not take it along."""
        self._spawn(
            "server",
            "beat",
            [sys.executable, "-m", "celery", "-A", "worker.app", "beat", "--loglevel", "INFO",
             "--schedule", str(self.hosts["server"].root / "beat-schedule")],
            self.worker_env("server", "beat"),
        )  # fmt: skip

    def start_lab(self, lab: str) -> None:
        """One agent serving emulated iPhones (their usbmuxd on the lab host's own loopback)."""
        self._spawn(
            lab,
            "agent",
            [sys.executable, "-m", "agent", "--name", lab, "--driver", "emulated",
             "--simulated", ",".join(self.labs[lab]), "--work-dir", str(self.hosts[lab].root / "work"),
             "--poll-interval", "0.5", *self.agent_args],
            self.agent_env(lab),
        )  # fmt: skip

    def agent_env(self, lab: str) -> dict[str, str]:
        return self.env(
            lab, DECODEBENCH_SERVER_URL=self.server_url, DECODEBENCH_AGENT_TOKEN=self.tokens[lab]
        )

    def role_settings(self) -> dict[str, set[str]]:
        """The DECODEBENCH_* settings each role is started with (docker-compose.yml and the
        operator guide name the same), tuning knobs for short tests left out."""
        tokens = dict(self.tokens)
        self.tokens = {name: "token" for name in ("beat", *self.builders, *self.labs)}
        try:
            given = {
                "server": self.server_env(),
                "worker": self.worker_env(self.builders[0], self.builders[0]),
                "beat": self.worker_env("server", "beat"),
                "agent": self.agent_env(next(iter(self.labs))),
            }
        finally:
            self.tokens = tokens
        tuning = {*self.server_settings, *TUNING}
        return {
            role: {key for key in env if key.startswith("DECODEBENCH_") and key not in tuning}
            for role, env in given.items()
        }

    def up(self) -> None:
        """Start order (START_ORDER): database, server (migrate, tokens), builders, beat, labs."""
        self.down(quiet=True)
        if self.root.exists():
            shutil.rmtree(self.root)
        self._folders()
        self.network()
        self.start_database()
        self.prepare()
        self.start_server()
        for builder in self.builders:
            self.start_builder(builder)
        self.start_beat()
        for lab in self.labs:
            self.start_lab(lab)
        (self.root / "tokens.json").write_text(json.dumps(self.tokens, indent=1))

    def down(self, quiet: bool = False) -> None:
        """Kill every process in the namespaces (ours by pid first, then any left from a
        crashed run), delete the namespaces, the links and the bridge. Safe to repeat."""
        stop_process_groups(self.processes.values(), grace_s=15)
        self.processes.clear()
        existing = set(_ip("netns", "list", check=False).stdout.split())
        namespaces = [host.namespace for host in self.hosts.values()]
        namespaces += [ns for ns in existing if ns.startswith(f"{self.prefix}-")]
        for namespace in dict.fromkeys(namespaces):
            if namespace not in existing:
                continue
            _kill_namespace(namespace)
            _ip("netns", "delete", namespace, check=False)
        for host in self.hosts.values():
            _ip("link", "delete", host.link, check=False)
        _ip("link", "delete", self.bridge, check=False)
        if not quiet:
            print(f"topology {self.prefix} down")

    # -- using it ------------------------------------------------------------------------------

    def client(self, token: str | None = None):  # noqa: ANN201 (httpx is imported late)
        import httpx

        token = token or self.tokens["operator"]
        return httpx.Client(
            base_url=self.server_url, headers={"Authorization": f"Bearer {token}"}, timeout=30
        )

    def sql(self, query: str, **params: Any) -> list[tuple[Any, ...]]:
        """Read the db host's database from the operator's desk, over the network."""
        import psycopg

        url = self.database_url.replace("postgresql+psycopg://", "postgresql://")
        with psycopg.connect(url, connect_timeout=5) as connection:
            return list(connection.execute(query, params).fetchall())  # type: ignore[arg-type]

    def cpu_seconds(self) -> float:
        """CPU time (user + system) of every process running in the topology's namespaces."""
        ticks = os.sysconf("SC_CLK_TCK")
        total = 0.0
        for host in self.hosts.values():
            for pid in _namespace_pids(host.namespace):
                try:
                    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                total += (int(fields[11]) + int(fields[12])) / ticks
        return total

    def _wait(self, condition: Any, what: str, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            self.check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out waiting for {what} (logs under {self.root})")
            time.sleep(0.3)


def _terminate_with_parent() -> None:
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _namespace_pids(namespace: str) -> list[int]:
    listed = _ip("netns", "pids", namespace, check=False).stdout.split()
    return [int(pid) for pid in listed if pid.isdigit()]


def _kill_namespace(namespace: str) -> None:
    """Every process left in a namespace, by its id: SIGTERM, then SIGKILL after a grace."""
    for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        for pid in _namespace_pids(namespace):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while _namespace_pids(namespace) and time.monotonic() < deadline:
            time.sleep(0.1)


@dataclass
class SweepFigures:
    sweep_id: int
    state: str
    runs: int
    seconds: float
    first_result_s: float
    cpu_s: float
    runs_by_lab: dict[str, int]
    duplicates: int

    @property
    def runs_per_s(self) -> float:
        return self.runs / self.seconds

    def lines(self) -> Iterable[str]:
        load = " ".join(f"{value:.2f}" for value in os.getloadavg())
        yield f"sweep {self.sweep_id}: {self.state}, {self.runs} runs on {self.runs_by_lab}"
        yield f"time to first result: {self.first_result_s:.1f} s (from submission)"
        yield f"runs per second: {self.runs_per_s:.3f} ({self.runs} runs in {self.seconds:.1f} s)"
        yield f"CPU time of every role: {self.cpu_s:.1f} s, {self.cpu_s / self.runs:.2f} s per run"
        yield f"prompt results stored twice: {self.duplicates}; load average {load}"


def run_sweep(
    topology: Topology, spec: dict[str, Any] = SWEEP, timeout_s: float = 600.0
) -> SweepFigures:
    """Submit ``spec`` from the operator's desk and wait for it to end; time to its first
    succeeded run, runs per second, CPU time of the roles, and what the database holds."""
    cpu_before = topology.cpu_seconds()
    started = time.monotonic()
    first: float | None = None
    with topology.client() as client:
        answer = client.post("/api/v1/sweeps", json=spec)
        answer.raise_for_status()
        sweep_id = answer.json()["id"]
        while True:
            topology.check_alive()
            try:
                sweep = client.get(f"/api/v1/sweeps/{sweep_id}").json()
            except Exception:  # noqa: BLE001 (a partition test may cut the server mid-poll)
                time.sleep(0.5)
                continue
            if first is None and any(run["state"] == "succeeded" for run in sweep["runs"]):
                first = time.monotonic() - started
            if sweep["state"] in ("completed", "failed"):
                break
            if time.monotonic() - started > timeout_s:
                raise RuntimeError(f"sweep {sweep_id} did not end: {json.dumps(sweep)[:3000]}")
            time.sleep(0.25)
    seconds = time.monotonic() - started
    cpu = topology.cpu_seconds() - cpu_before
    by_lab = dict(
        topology.sql(
            "SELECT a.name, count(*) FROM runs r JOIN agents a ON a.id = r.agent_id "
            "WHERE r.sweep_id = %(id)s "
            "AND r.state = 'succeeded' GROUP BY a.name",
            id=sweep_id,
        )
    )
    duplicates = topology.sql(
        "SELECT count(*) FROM (SELECT run_id, prompt_index FROM prompt_results "
        "GROUP BY run_id, prompt_index HAVING count(*) > 1) twice"
    )[0][0]
    return SweepFigures(
        sweep_id=sweep_id,
        state=sweep["state"],
        runs=len(sweep["runs"]),
        seconds=seconds,
        first_result_s=first if first is not None else seconds,
        cpu_s=cpu,
        runs_by_lab={str(name): int(count) for name, count in by_lab.items()},
        duplicates=int(duplicates),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("command", choices=("up", "down", "sweep", "status"))
    parser.add_argument("--root", type=Path, default=DEFAULT_ROOT, help="per-host folders")
    parser.add_argument("--prefix", default=DEFAULT_PREFIX, help="namespace and link names")
    parser.add_argument("--subnet", default=DEFAULT_SUBNET, help="the hosts' /24, as A.B.C")
    args = parser.parse_args(argv)
    topology = Topology(root=args.root, prefix=args.prefix, subnet=args.subnet)
    if args.command == "down":
        topology.down()
        return 0
    reason = available()
    if reason:
        print(f"cannot build the topology: {reason}", file=sys.stderr)
        return 2
    if args.command == "up":
        try:
            topology.up()
        except Exception:
            topology.down(quiet=True)
            raise
        for name, host in topology.hosts.items():
            print(f"{name:8} {host.namespace:12} {host.address:12} {host.root}")
        print(f"server: {topology.server_url}  tokens: {topology.root / 'tokens.json'}")
        print(f"try: ip netns exec {topology.hosts['lab1'].namespace} ip addr; "
              f"python -m scripts.topology sweep; python -m scripts.topology down")  # fmt: skip
        return 0
    tokens = topology.root / "tokens.json"
    if not tokens.exists():
        print("the topology is not up (python -m scripts.topology up)", file=sys.stderr)
        return 2
    topology.tokens = json.loads(tokens.read_text())
    if args.command == "status":
        print(f"/api/v1/health: {topology.health()}")
        return 0
    figures = run_sweep(topology)
    for line in figures.lines():
        print(line)
    return 0 if figures.state == "completed" and figures.duplicates == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
