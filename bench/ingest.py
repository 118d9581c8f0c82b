"""Drive 50 and then 200 concurrent uploading devices against a real server and print figures.

    python -m bench.ingest --json

Starts PostgreSQL-backed server processes (`python -m server --workers N`) on its own database,
completes a set of builds as a worker would, submits sweeps, registers one agent with a device
per upload. Per level, every device first claims a run (as a device does when it starts one,
minutes before it uploads: claim latencies are reported apart). Then two phases, each client
uploading its devices' `RunResult`s, all of a run's prompts in one request:

1. **offered load**: all clients together offer `--rate` results/s (2,200: a tenth above the
   2,000/s goal, so a server that keeps up shows more than the goal once the phase's ramp-up and
   tail are counted), each client its share at a steady pace, staggered. Latency counts from
   when an upload was due, so a server that falls behind is charged for the queue it causes.
   These are the level's top figures.
2. **back to back** (`"back_to_back"`): the same clients send their next runs without pause,
   which measures capacity; with N clients always waiting, the mean latency is N divided by the
   throughput (Little's law), whatever the server does.

Bounded in count (uploads per client and phase) and in time. A health probe polls
`/api/v1/health` meanwhile. Prints one JSON object:
``{"50": {"results_per_s", "p50_ms", "p99_ms", "errors", "health_p99_ms", ..., "back_to_back":
{...}}, "200": {...}}`` where errors counts every non-2xx or failed request (claims, uploads and
health probes).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from pathlib import Path

import httpx

from scripts.stack import Stack, scratch_database
from scripts.standins import complete_builds

DEVICE_CLASS = "iphone-17-pro"
PROMPTS = 30  # the most a sweep asks for: one upload carries them all
CONTEXTS = (128, 192, 256, 320, 384, 448, 512, 576)
SPEC = {
    "model": "tiny-gqa",
    "variants": [
        {"attention": attention, "context": context}
        for attention in ("folded", "repeat_kv")
        for context in CONTEXTS
    ],
    "devices": [DEVICE_CLASS],
    "prompts": PROMPTS,
    "decode_tokens": 8,
    "repetitions": 10,
}
RUNS_PER_SWEEP = len(SPEC["variants"]) * SPEC["repetitions"]
ONE_CONNECTION = httpx.Limits(max_connections=1, max_keepalive_connections=1)
JSON_BODY = {"Content-Type": "application/json"}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def udid(index: int) -> str:
    return f"BENCH-{index:04d}"


def prepare(stack: Stack, runs_needed: int, devices: int) -> None:
    with httpx.Client(base_url=stack.server_url, timeout=60) as client:
        user, worker = stack.tokens["user"], stack.tokens["worker"]
        for index in range(-(-runs_needed // RUNS_PER_SWEEP)):
            sweep = client.post("/api/v1/sweeps", json=SPEC, headers=bearer(user))
            sweep.raise_for_status()
            if index == 0:  # later sweeps share these builds (same keys)
                complete_builds(client, sweep.json()["builds"], worker)
        inventory = [
            {"udid": udid(i), "device_class": DEVICE_CLASS, "product_type": "iPhone18,1",
             "driver": "simulated", "simulated": True}
            for i in range(devices)
        ]  # fmt: skip
        client.post(
            "/api/v1/agents/register",
            json={"name": "bench-host", "devices": inventory},
            headers=bearer(stack.tokens["agent"]),
        ).raise_for_status()


def run_result(device: str, decode_tokens: int) -> dict:
    return {
        "device_udid": device, "device_class": DEVICE_CLASS, "product_type": "iPhone18,1",
        "driver": "simulated", "simulated": True, "load_time_cold_ms": 900.0,
        "load_time_warm_ms": 120.0, "peak_memory_bytes": 1 << 28, "timing_model": "bench",
        "prompts": [
            {"prompt_index": i, "prompt_tokens": 40 + i, "generated_tokens": decode_tokens,
             "ttft_ms": 30.0 + i, "prefill_tok_s": 800.0, "decode_tok_s": 40.0 + i / 10,
             "token_latencies_ms": [25.0 + (i + t) % 3 for t in range(decode_tokens)]}
            for i in range(PROMPTS)
        ],
    }  # fmt: skip


def settle_database(database_url: str) -> None:
    """Vacuum, analyse and checkpoint after the setup's thousands of inserts, so neither level
    measures autovacuum or a checkpoint catching up with them."""
    import psycopg

    with psycopg.connect(database_url.replace("+psycopg", ""), autocommit=True) as connection:
        connection.execute("VACUUM ANALYZE")
        connection.execute("CHECKPOINT")


class Tally:
    def __init__(self) -> None:
        self.upload_ms: list[float] = []
        self.claim_ms: list[float] = []
        self.health_ms: list[float] = []
        self.results = 0
        self.errors = 0
        self.statuses: dict[str, int] = {}
        self.details: list[str] = []  # the first few refusals' answers, to tell what went wrong

    def fail(self, what: str, detail: str = "") -> None:
        self.errors += 1
        self.statuses[what] = self.statuses.get(what, 0) + 1
        if detail and len(self.details) < 3:
            self.details.append(f"{what}: {detail[:300]}")


async def claim_runs(client: httpx.AsyncClient, devices: list[str], tally: Tally) -> list[tuple]:
    """Every device claims one run, as it would when it starts one (minutes before it uploads)."""
    claimed = []
    for device in devices:
        started = time.perf_counter()
        try:
            claim = await client.post("/api/v1/agents/claim", json={"device_udid": device})
        except httpx.HTTPError as error:
            tally.fail(f"claim {type(error).__name__}")
            continue
        tally.claim_ms.append((time.perf_counter() - started) * 1000)
        if claim.status_code != 200 or claim.json()["run"] is None:
            tally.fail(f"claim {claim.status_code}")
            continue
        run = claim.json()["run"]
        body = json.dumps(run_result(device, run["decode_tokens"])).encode()
        claimed.append((run["run_id"], body))
    return claimed


async def upload_loop(
    client: httpx.AsyncClient, runs: list[tuple], deadline: float, tally: Tally,
    interval: float = 0.0, offset: float = 0.0,
) -> None:  # fmt: skip
    """One uploading client: its devices' finished runs, one request per run. Back to back
    when ``interval`` is 0; otherwise the k-th upload is due at ``offset + k * interval`` after
    the start, and its latency counts from when it was due, so a server that falls behind is
    charged for the wait it caused (no coordinated omission)."""
    begun = time.perf_counter()
    for k, (run_id, body) in enumerate(runs):
        if time.monotonic() > deadline:
            return
        due = begun + offset + k * interval
        if interval:
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
        started = due if interval else time.perf_counter()
        try:
            upload = await client.post(
                f"/api/v1/runs/{run_id}/results", content=body, headers=JSON_BODY
            )
        except httpx.HTTPError as error:
            tally.fail(f"upload {type(error).__name__}")
            continue
        tally.upload_ms.append((time.perf_counter() - started) * 1000)
        if upload.status_code != 200:
            tally.fail(f"upload {upload.status_code}", upload.text)
            continue
        tally.results += upload.json()["prompts_stored"]


async def health_loop(url: str, stop: asyncio.Event, tally: Tally) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        while not stop.is_set():
            started = time.perf_counter()
            try:
                response = await client.get("/api/v1/health")
                tally.health_ms.append((time.perf_counter() - started) * 1000)
                if response.status_code != 200:
                    tally.fail(f"health {response.status_code}")
            except httpx.HTTPError as error:
                tally.fail(f"health {type(error).__name__}")
            await asyncio.sleep(0.05)


def percentile(values: list[float], fraction: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(fraction * len(ordered)))], 1)


async def phase(
    stack: Stack, sessions: list, claimed: list, seconds: float, rate: float
) -> dict:  # fmt: skip
    """All clients upload their claimed runs, paced to ``rate`` results/s in all (each client
    its share, staggered) or back to back when ``rate`` is 0, while a probe polls /health."""
    tally, stop = Tally(), asyncio.Event()
    health = asyncio.create_task(health_loop(stack.server_url, stop, tally))
    interval = len(sessions) * PROMPTS / rate if rate else 0.0
    started = time.monotonic()
    await asyncio.gather(
        *(
            upload_loop(
                session, runs, started + seconds, tally, interval, interval * index / len(sessions)
            )  # fmt: skip
            for index, (session, runs) in enumerate(zip(sessions, claimed, strict=True))
        )
    )
    elapsed = time.monotonic() - started
    stop.set()
    await health
    return {
        "results_per_s": round(tally.results / elapsed, 1),
        "p50_ms": percentile(tally.upload_ms, 0.50),
        "p99_ms": percentile(tally.upload_ms, 0.99),
        "errors": tally.errors,
        "health_p99_ms": percentile(tally.health_ms, 0.99),
        "uploads": len(tally.upload_ms),
        "results": tally.results,
        "seconds": round(elapsed, 2),
        "health_probes": len(tally.health_ms),
        "error_kinds": tally.statuses,
        "error_details": tally.details,
    }


async def level(
    stack: Stack, clients: int, first: int, uploads: int, seconds: float, rate: float
) -> dict:  # fmt: skip
    """Each client is a device host with its own connection, as on a real farm: one shared
    pool of ``clients`` connections would cost the benchmark's process more CPU choosing a
    connection than it spends encoding the uploads, on the cores the server needs.

    First the offered load (``rate`` results/s from all clients together), then the capacity:
    the same clients uploading back to back, each its next runs."""
    headers = bearer(stack.tokens["agent"])
    sessions = [
        httpx.AsyncClient(
            base_url=stack.server_url, headers=headers, limits=ONE_CONNECTION, timeout=60
        )  # fmt: skip
        for _ in range(clients)
    ]
    try:
        devices = [
            [udid(first + i * 2 * uploads + k) for k in range(2 * uploads)] for i in range(clients)
        ]
        claims = Tally()
        claimed = await asyncio.gather(
            *(
                claim_runs(session, mine, claims)
                for session, mine in zip(sessions, devices, strict=True)
            )
        )
        paced = await phase(stack, sessions, [runs[:uploads] for runs in claimed], seconds, rate)
        capacity = await phase(stack, sessions, [runs[uploads:] for runs in claimed], seconds, 0)
    finally:
        await asyncio.gather(*(session.aclose() for session in sessions))
    return {
        **paced,
        "errors": paced["errors"] + claims.errors,
        "offered_results_per_s": rate,
        "claim_p50_ms": percentile(claims.claim_ms, 0.50),
        "claim_p99_ms": percentile(claims.claim_ms, 0.99),
        "claim_errors": claims.errors,
        "claim_error_kinds": claims.statuses,
        "back_to_back": capacity,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print only the JSON object")
    parser.add_argument("--workers", type=int, default=2, help="server processes")
    parser.add_argument("--levels", default="50,200", help="concurrent clients per level")
    parser.add_argument(
        "--uploads", type=int, default=1200,
        help="uploads per level and phase, shared among its clients (1,200: 16 s at 2,200/s)",
    )  # fmt: skip
    parser.add_argument("--seconds", type=float, default=60.0, help="time bound per phase")
    parser.add_argument(
        "--rate", type=float, default=2200.0,
        help="results/s all clients together offer in the first phase (0: back to back)",
    )  # fmt: skip
    parser.add_argument(
        "--database", default="decodebench_bench_ingest", help="created afresh, then dropped"
    )
    args = parser.parse_args()
    levels = [int(value) for value in args.levels.split(",")]
    with (
        scratch_database(args.database) as database_url,
        tempfile.TemporaryDirectory(prefix="bench-ingest-") as var,
    ):
        stack = Stack(
            database_url=database_url,
            broker_url=os.environ.get("DECODEBENCH_BENCH_BROKER_URL", "memory://"),
            var_dir=Path(var),
        )
        try:
            stack.prepare()
            stack.start_server("--workers", str(args.workers), "--no-access-log")
            per_client = {clients: max(1, args.uploads // clients) for clients in levels}
            # Every upload is its own device's run: the paced phase's, then the others'.
            devices = sum(clients * per_client[clients] * 2 for clients in levels)
            prepare(stack, devices, devices)
            settle_database(database_url)
            figures, first = {}, 0
            for clients in levels:
                figures[str(clients)] = asyncio.run(
                    level(stack, clients, first, per_client[clients], args.seconds, args.rate)
                )
                first += clients * per_client[clients] * 2
            figures["setup"] = {
                "server_workers": args.workers, "prompts_per_upload": PROMPTS,
                "uploads_per_level_and_phase": args.uploads, "cpus": os.cpu_count(),
                "load_average_1m": round(os.getloadavg()[0], 2),
            }  # fmt: skip
        finally:
            stack.stop()
    print(json.dumps(figures) if args.json else json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
