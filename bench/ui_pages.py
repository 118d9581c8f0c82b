"""Server time of the heaviest pages: the sweeps list with 1,000 sweeps in the database, and one
sweep page with 10 variants × 4 device classes (every class the catalog has) × 30 prompts.

The data goes in through the real API (workers and agents played over HTTP, in process) on a
scratch PostgreSQL database, then each page is fetched repeatedly through the ASGI app; the
time is from request to the last byte of the response, median and max of the repeats.

The issue asks for 5 device classes; the catalog has 4 (three iPhones with sourced bandwidths
and the host CPU) and the server refuses any other, so a fifth cannot be entered honestly.
``--variants 13`` gives the big sweep 13 × 4 = 52 variant × class cells, more than 10 × 5's 50,
as many runs and prompt rows as the page would have to show.

    python -m bench.ui_pages [--sweeps 1000] [--repeats 20] [--variants 10] [--profile N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

# The repository root, for scripts.standins (scripts/ is not an installed package).

SCRATCH = "decodebench_bench_ui"
ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
CONTEXTS = (128, 256, 512, 1024, 2048)
ANALYSIS = {
    "functions": ["main"], "decode_function": "main", "ops_total": 120, "non_const_ops": 90,
    "dispatch_ops": 80, "op_counts": {"matmul": 40, "tile": 4, "softmax": 8}, "tile_ops": 4,
    "tile_output_bytes": 4096, "tiles": [], "slice_update_ops": 4, "state_write_ops": 4,
    "state_read_ops": 4, "weight_bytes": 1 << 24, "weight_file_bytes": 1 << 24,
    "state_bytes": 1 << 20, "states": [],
    "bytes_per_token": {"weights": 1 << 24, "kv_read": 1 << 20, "kv_write": 1 << 12,
                        "redundant": 1 << 16, "total": (1 << 24) + (1 << 20)},
}  # fmt: skip


def recreate_database() -> str:
    import psycopg

    with psycopg.connect(ADMIN_URL, autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{SCRATCH}" WITH (FORCE)')
        connection.execute(f'CREATE DATABASE "{SCRATCH}"')
    return f"postgresql+psycopg://postgres@127.0.0.1:5432/{SCRATCH}"


def run_all(client, devices: list[dict], agent: dict, prompts: int) -> None:
    for device in devices:
        while True:
            claim = client.post(
                "/api/v1/agents/claim", json={"device_udid": device["udid"]}, headers=agent
            ).json()["run"]
            if claim is None:
                break
            result = {
                **{key: device[key] for key in ("device_class", "product_type", "driver")},
                "device_udid": device["udid"], "simulated": True, "load_time_cold_ms": 10.0,
                "load_time_warm_ms": 5.0, "peak_memory_bytes": 1 << 20, "timing_model": "bench",
                "prompts": [
                    {"prompt_index": i, "prompt_tokens": 5, "generated_tokens": 2, "ttft_ms": 3.0,
                     "prefill_tok_s": 100.0, "decode_tok_s": 50.0 + (claim["run_id"] * 7 + i) % 13,
                     "token_latencies_ms": [1.0, 1.0]}
                    for i in range(prompts)
                ],
            }  # fmt: skip
            stored = client.post(
                f"/api/v1/runs/{claim['run_id']}/results", json=result, headers=agent
            )
            assert stored.status_code == 200, stored.text


def timed(client, path: str, repeats: int) -> tuple[float, float]:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        response = client.get(path)
        times.append((time.perf_counter() - started) * 1000)
        assert response.status_code == 200, response.text[:500]
    return statistics.median(times), max(times)


def profile(sweep_id: int, repeats: int) -> None:
    """Where the sweep page's time goes, in process (the test client serves on another
    thread): the figures and the template, the functions with the most cumulative time."""
    import cProfile
    import pstats

    from server.db import get_sessionmaker
    from server.ui.frame import templates
    from server.ui.sweep_pages import sweep_context

    profiler = cProfile.Profile()
    for _ in range(repeats):
        with get_sessionmaker()() as session:
            profiler.enable()
            context = sweep_context(session, sweep_id)
            templates.get_template("sweep.html").render(**context, user=None, csrf_token="")
            profiler.disable()
    pstats.Stats(profiler, stream=sys.stderr).sort_stats("cumulative").print_stats(45)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweeps", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument(
        "--variants", type=int, default=10, choices=range(2, 21), metavar="2..20",
        help="variants in the big sweep (13 x 4 classes stands in for 10 x 5: the catalog has 4)",
    )  # fmt: skip
    parser.add_argument("--profile", type=int, default=0, help="profile N sweep page requests")
    args = parser.parse_args()
    os.environ["DECODEBENCH_DATABASE_URL"] = recreate_database()
    os.environ.setdefault("DECODEBENCH_ENVIRONMENT", "test")
    os.environ["DECODEBENCH_BROKER_URL"] = "redis://127.0.0.1:6379/14"
    os.environ["DECODEBENCH_ARTIFACT_DIR"] = f"/tmp/{SCRATCH}-artifacts"

    from fastapi.testclient import TestClient

    from decodebench.contracts.profiles import DEVICE_PROFILES
    from scripts.standins import complete_builds
    from server.app import app
    from server.manage import create_token_command, migrate

    migrate()
    user_plain = create_token_command("user", "bench", None)
    worker = create_token_command("worker", "w", None)
    agent = {"Authorization": f"Bearer {create_token_command('agent', 'a', None)}"}
    user = {"Authorization": f"Bearer {user_plain}"}
    classes = list(DEVICE_PROFILES)
    devices = [
        {"udid": f"BENCH-{index}", "device_class": name, "product_type": "iPhone18,1",
         "os_version": "26.1", "driver": "simulated", "simulated": True}
        for index, name in enumerate(classes)
    ]  # fmt: skip
    with TestClient(app) as client:
        client.post(
            "/api/v1/agents/register", json={"name": "bench", "devices": devices}, headers=agent
        )
        variants = [
            {"attention": attention, "context": context, "quant": quant}
            for quant in ("fp16", "w8")
            for attention in ("repeat_kv", "folded")
            for context in CONTEXTS
        ][: args.variants]
        big = {"model": "tiny-gqa", "variants": variants, "devices": classes, "prompts": 30}
        sweep = client.post("/api/v1/sweeps", json=big, headers=user).json()
        complete_builds(client, sweep["builds"], worker, ANALYSIS)
        run_all(client, devices, agent, prompts=30)
        small = {
            "model": "tiny-gqa",
            "variants": [variants[0]],
            "devices": classes[:1],
            "prompts": 1,
        }
        for _ in range(args.sweeps - 1):
            assert client.post("/api/v1/sweeps", json=small, headers=user).status_code == 201

        form = client.get("/login").text
        csrf = form.split('name="csrf_token" value="')[1].split('"')[0]
        client.post("/login", data={"token": user_plain, "csrf_token": csrf})
        list_median, list_max = timed(client, "/", args.repeats)
        first_read, _ = timed(client, f"/sweeps/{sweep['id']}", 1)  # computes the verdicts
        page_median, page_max = timed(client, f"/sweeps/{sweep['id']}", args.repeats)
        live_median, live_max = timed(client, f"/sweeps/{sweep['id']}/live", args.repeats)
        if args.profile:
            profile(sweep["id"], args.profile)
    print(f"sweeps in the database: {args.sweeps}")
    print(f"sweeps list (/):               median {list_median:.0f} ms, max {list_max:.0f} ms")
    print(
        f"sweep page ({len(variants)} variants x {len(classes)} classes x 30 prompts): "
        f"median {page_median:.0f} ms, max {page_max:.0f} ms"
    )
    print(f"sweep live fragment:           median {live_median:.0f} ms, max {live_max:.0f} ms")
    print(
        f"sweep page, first read after it ended (verdicts computed and stored): {first_read:.0f} ms"
    )


if __name__ == "__main__":
    main()
