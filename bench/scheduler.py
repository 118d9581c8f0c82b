"""A farm of simulated phones against several server processes: throughput, utilisation, claim
and first-pickup latency, server CPU per run and when idle. Every device is SIMULATED.

    python -m bench.scheduler --json [--sizes 200,1000]

Per size it starts the stack on its own database (`python -m server --workers N`), as many
agent processes as it needs (`--devices-per-agent`, each `python -m agent --simulated …` with
`--time-scale` chosen so one run sleeps about `--run-seconds`), and then:

1. idle: every device holds a long-poll claim; the server processes' CPU over `--idle-seconds`
   is `idle_cpu_percent` (of one core);
2. first pickup: `--pickups` one-run sweeps submitted one at a time while the devices are idle;
   each one's latency is its run's `started_at` minus its sweep's `created_at` (both from the
   database; `created_at` is its transaction's start, so this over-states the latency a little);
3. busy: enough runs for `--busy-seconds` of every device's time are submitted waiting for
   their build, then the build completes and makes them claimable at once (t0); t1 is when
   the last of them is claimed, or a minute has passed without any claim (a stall: the runs
   still queued count as errors). `utilisation` is the devices' run time (each run's started_at
   to finished_at, clipped to [t0, t1]) ÷ (devices × (t1 − t0)); `runs_per_s` the runs
   finished in the window ÷ its length; `claim_p99_ms` the agents' claim round trips sent in
   the window (they log each one); `server_cpu_ms_per_run` the server processes' CPU in the
   window ÷ those runs; `errors` every WARNING or ERROR line of the agents and the server plus
   every failed run; `longest_claim_gap_s` the longest time without any claim in the window
   (a stall).

Prints one JSON object keyed by size. Where the rest of the machine went in the busy window:
`agent_cpu_ms_per_run` (the agent processes), `postgres_cpu_ms_per_run` (every PostgreSQL
process, its other databases' work included) and `machine_cpu_percent` (all of it).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import psutil
import psycopg

from scripts.stack import Stack
from scripts.standins import complete_builds, moving, time_scale_for

DEVICE_CLASS = "iphone-17-pro"
ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
BYTES_PER_TOKEN = 50_000_000
PROMPTS, DECODE_TOKENS = 2, 8  # small uploads: the scheduling is measured, not the ingest
CONTEXTS = (128, 192, 256, 320, 384, 448, 512, 576)
STALL_S = 60.0  # this long without a claim while runs are queued: a stall
CLAIM_LINE = re.compile(r"claim answered in ([0-9.]+) ms, sent at ([0-9.]+)")


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def spec(variants: list[dict], repetitions: int) -> dict:
    return {"model": "tiny-gqa", "variants": variants, "devices": [DEVICE_CLASS],
            "prompts": PROMPTS, "decode_tokens": DECODE_TOKENS, "repetitions": repetitions}  # fmt: skip


BULK_VARIANTS = [{"attention": a, "context": c} for a in ("folded", "repeat_kv") for c in CONTEXTS]
PICKUP_VARIANTS = [{"attention": "folded", "context": 1024}]


class Cpu:
    """CPU seconds of processes and all their descendants, the ones that ended (and were reaped)
    included: the server's processes, the agents, PostgreSQL's backends."""

    def __init__(self, *pids: int) -> None:
        self.roots = [psutil.Process(pid) for pid in pids]

    def seconds(self) -> float:
        total = 0.0
        for root in self.roots:
            try:
                children = root.children(recursive=True)
                times = root.cpu_times()
            except psutil.NoSuchProcess:
                continue
            total += times.user + times.system + times.children_user + times.children_system
            for process in children:
                try:
                    times = process.cpu_times()
                    total += times.user + times.system
                except psutil.NoSuchProcess:
                    pass
        return total


def postmaster_pid(database_url: str) -> int:
    directory = sql(database_url, "SHOW data_directory")[0][0]
    return int((Path(directory) / "postmaster.pid").read_text().split()[0])


def sql(database_url: str, query: str, **params: object) -> list[tuple]:
    with psycopg.connect(database_url.replace("+psycopg", "")) as connection:
        return connection.execute(query, params).fetchall()


def percentile(values: list[float], fraction: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(fraction * len(ordered)))], 1)


def run_size(devices: int, args: argparse.Namespace, scale: float, var_dir: Path) -> dict:
    database = f"decodebench_bench_sched_{devices}"
    with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{database}"')
    url = f"postgresql+psycopg://postgres@127.0.0.1:5432/{database}"
    stack = Stack(database_url=url, broker_url=args.redis_url, var_dir=var_dir)
    stack.prepare()
    stack.start_server(
        "--workers", str(args.servers), "--no-access-log",
        DECODEBENCH_DB_POOL_SIZE=str(args.pool_size), DECODEBENCH_DB_MAX_OVERFLOW="4",
    )  # fmt: skip
    agents = -(-devices // args.devices_per_agent)
    try:
        for index in range(agents):
            count = min(args.devices_per_agent, devices - index * args.devices_per_agent)
            token = stack.manage("create-token", "--kind", "agent", "--name", f"bench-{index}")
            command = [
                sys.executable, "-m", "agent", "--name", f"bench-{index}",
                "--simulated", ",".join([DEVICE_CLASS] * count),
                "--work-dir", str(var_dir / f"agent-{index}"), "--time-scale", f"{scale:.6g}",
                "--noise-scale", "0", "--claim-wait", str(args.claim_wait),
                "--log-level", "INFO",
            ]  # fmt: skip
            stack._spawn(f"agent-{index}", command, stack.env(DECODEBENCH_AGENT_TOKEN=token))
        registered = "SELECT count(*) FROM devices WHERE connected AND status = 'ready'"
        deadline = time.monotonic() + 60 + devices / 5
        while sql(url, registered)[0][0] < devices:
            stack.check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {sql(url, registered)[0][0]} of {devices} registered")
            time.sleep(1)
        cpu = Cpu(stack.processes["server"].pid)
        agent_cpu = Cpu(*(p.pid for n, p in stack.processes.items() if n.startswith("agent-")))
        postgres_cpu = Cpu(postmaster_pid(url))
        time.sleep(args.settle_seconds)  # every device's first claim is now a long poll

        before = cpu.seconds()
        time.sleep(args.idle_seconds)
        idle_cpu_percent = (cpu.seconds() - before) / args.idle_seconds * 100

        user, worker = stack.tokens["user"], stack.tokens["worker"]
        with httpx.Client(base_url=stack.server_url, timeout=120) as client:
            first = client.post("/api/v1/sweeps", json=spec(PICKUP_VARIANTS, 1),
                                headers=bearer(user)).json()  # fmt: skip
            complete_builds(client, first["builds"], worker, moving(BYTES_PER_TOKEN))
            pickups = []
            for _ in range(args.pickups):
                time.sleep(0.5)
                sweep = client.post("/api/v1/sweeps", json=spec(PICKUP_VARIANTS, 1),
                                    headers=bearer(user)).json()  # fmt: skip
                waited = time.monotonic() + 30
                while time.monotonic() < waited:
                    row = sql(url, "SELECT min(r.started_at) - s.created_at FROM runs r JOIN sweeps s"
                              " ON s.id = r.sweep_id WHERE s.id = %(id)s GROUP BY s.created_at",
                              id=sweep["id"])  # fmt: skip
                    if row and row[0][0] is not None:
                        pickups.append(row[0][0].total_seconds() * 1000)
                        break
                    time.sleep(0.05)
            time.sleep(args.run_seconds * 1.5)  # the pickup runs finish

            needed = int(devices * args.busy_seconds / args.run_seconds)
            per_sweep = len(BULK_VARIANTS) * 10
            bulk_builds: list[dict] = []
            for _ in range(-(-needed // per_sweep)):
                sweep = client.post("/api/v1/sweeps", json=spec(BULK_VARIANTS, 10),
                                    headers=bearer(user)).json()  # fmt: skip
                bulk_builds = bulk_builds or sweep["builds"]
            cpu_before, machine_before = cpu.seconds(), psutil.cpu_times()
            agent_before, postgres_before = agent_cpu.seconds(), postgres_cpu.seconds()
            t0 = datetime.now(UTC)
            wall_t0 = time.time()
            complete_builds(client, bulk_builds, worker, moving(BYTES_PER_TOKEN))
        queued = "SELECT count(*) FROM runs WHERE state IN ('queued', 'waiting_build')"
        # However long a saturated machine takes, the queue is waited out while it moves; a minute
        # without any run claimed is a stall, and ends the window with the runs left queued.
        claimed = "SELECT count(*) FROM runs WHERE started_at IS NOT NULL"
        progress, moved_at = -1, time.monotonic()
        while sql(url, queued)[0][0] > 0:
            stack.check_alive()
            now_claimed = sql(url, claimed)[0][0]
            if now_claimed != progress:
                progress, moved_at = now_claimed, time.monotonic()
            elif time.monotonic() - moved_at > STALL_S:
                break  # reported as a stall: runs left queued
            time.sleep(0.5)
        t1 = datetime.now(UTC)
        wall_t1 = time.time()
        server_cpu = cpu.seconds() - cpu_before
        agents_cpu = agent_cpu.seconds() - agent_before
        database_cpu = postgres_cpu.seconds() - postgres_before
        machine = psutil.cpu_times()
        machine_busy = sum(getattr(machine, f) - getattr(machine_before, f)
                           for f in ("user", "system", "nice", "irq", "softirq"))  # fmt: skip
        window_s = max((t1 - t0).total_seconds(), 1e-3)
        time.sleep(args.run_seconds * 2)  # the last runs finish
        run_s, finished = sql(
            url,
            "SELECT coalesce(sum(extract(epoch FROM least(finished_at, %(t1)s)"
            " - greatest(started_at, %(t0)s))), 0), count(*) FILTER (WHERE finished_at <= %(t1)s)"
            " FROM runs WHERE state = 'succeeded' AND started_at < %(t1)s AND finished_at > %(t0)s",
            t0=t0, t1=t1,
        )[0]  # fmt: skip
        left = sql(url, queued)[0][0]
        failed = sql(url, "SELECT count(*) FROM runs WHERE state = 'failed'")[0][0]
        starts = [row[0] for row in sql(url, "SELECT started_at FROM runs WHERE started_at"
                  " BETWEEN %(t0)s AND %(t1)s ORDER BY started_at", t0=t0, t1=t1)]  # fmt: skip
        gaps = [(b - a).total_seconds() for a, b in zip([t0, *starts], [*starts, t1], strict=True)]
    finally:
        # agents first: a server stopping under their long polls would only log their retries
        for name, process in list(stack.processes.items()):
            if name.startswith("agent-") and process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for name, process in list(stack.processes.items()):
            if name.startswith("agent-"):
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
        stack.stop()
    claims, problems = [], []
    for log in sorted(var_dir.glob("*.log")):
        for line in log.read_text(errors="replace").splitlines():
            match = CLAIM_LINE.search(line)
            if match and wall_t0 <= float(match[2]) <= wall_t1:
                claims.append(float(match[1]))
            if any(mark in line for mark in (" WARNING ", " ERROR ", "ERROR:", "Traceback")):
                problems.append(f"{log.stem}: {line[:200]}")
    with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
    figures = {
        "runs_per_s": round(finished / window_s, 2),
        "utilisation": round(float(run_s) / (devices * window_s), 3),
        "claim_p99_ms": percentile(claims, 0.99),
        "first_pickup_p99_ms": percentile(pickups, 0.99),
        "errors": len(problems) + failed + left,
        "server_cpu_ms_per_run": round(server_cpu * 1000 / max(finished, 1), 1),
        "idle_cpu_percent": round(idle_cpu_percent, 2),
        "simulated": True,
        "devices": devices, "agent_processes": agents, "server_processes": args.servers,
        "window_s": round(window_s, 1), "runs_finished": finished,
        "claim_p50_ms": percentile(claims, 0.5), "claims_timed": len(claims),
        "first_pickup_p50_ms": percentile(pickups, 0.5), "pickups_timed": len(pickups),
        "longest_claim_gap_s": round(max(gaps), 2) if gaps else None,
        "agent_cpu_ms_per_run": round(agents_cpu * 1000 / max(finished, 1), 1),
        "postgres_cpu_ms_per_run": round(database_cpu * 1000 / max(finished, 1), 1),
        "runs_left_queued": left, "runs_failed": failed,
        "machine_cpu_percent": round(machine_busy / window_s / psutil.cpu_count() * 100, 1),
        "error_lines": problems[:5],
    }  # fmt: skip
    if args.busy_seconds == 0:  # idle and first pickup only
        for name in (
            "runs_per_s",
            "utilisation",
            "claim_p99_ms",
            "server_cpu_ms_per_run",
            "agent_cpu_ms_per_run",
            "postgres_cpu_ms_per_run",
            "window_s",
            "claim_p50_ms",
            "longest_claim_gap_s",
            "machine_cpu_percent",
        ):
            figures[name] = None  # fmt: skip
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print only the JSON object")
    parser.add_argument("--sizes", default="200,1000", help="device counts, comma-separated")
    parser.add_argument("--servers", type=int, default=3, help="server processes")
    parser.add_argument("--pool-size", type=int, default=8, help="connections per process")
    parser.add_argument("--devices-per-agent", type=int, default=100)
    parser.add_argument("--run-seconds", type=float, default=5.0, help="each run sleeps this")
    parser.add_argument("--busy-seconds", type=float, default=120.0,
                        help="queued work per device (0: measure idle cost and first pickup only)")  # fmt: skip
    parser.add_argument("--idle-seconds", type=float, default=20.0)
    parser.add_argument("--settle-seconds", type=float, default=5.0)
    parser.add_argument("--pickups", type=int, default=20)
    parser.add_argument("--claim-wait", type=int, default=50, help="the agents' long poll")
    parser.add_argument("--redis-url", default=os.environ.get("DECODEBENCH_BENCH_REDIS_URL",
                        "redis://127.0.0.1:6379/11"))  # fmt: skip
    args = parser.parse_args()
    scale = time_scale_for(args.run_seconds, DEVICE_CLASS, PROMPTS, DECODE_TOKENS, BYTES_PER_TOKEN)
    figures = {}
    for size in (int(text) for text in args.sizes.split(",")):
        var_dir = Path(tempfile.mkdtemp(prefix=f"bench-scheduler-{size}-"))
        try:
            figures[str(size)] = run_size(size, args, scale, var_dir)
        finally:
            shutil.rmtree(var_dir, ignore_errors=True)
        if not args.json:
            print(f"{size} devices: {json.dumps(figures[str(size)])}", file=sys.stderr)
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
