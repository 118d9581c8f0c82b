"""A doctor job on SmolLM2-135M converted by Apple's Llama recipe, through the whole service:
server, build worker and agent (two simulated iPhone classes) as processes on a scratch database.

    python -m bench.smollm2_doctor_job                        # 2 chat prompts x 8 greedy steps
    python -m bench.smollm2_doctor_job --prompts 5 --steps 16

Uploads the recipe's package (converted once, decodebench/formats/coreml/recipe.py), starts a doctor job,
waits for it and for its A/B sweep, downloads the repaired package, and prints the figures: the
upload, the job's wall and worker seconds, the first overflow and the overflowing layers, the
repairs and their agreement, the waste, the A/B rows (SIMULATED devices) and the load average.
Needs Redis (the broker; DECODEBENCH_BENCH_BROKER_URL, default redis://127.0.0.1:6379/13).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from decodebench.building.realmodels import fetch_model
from decodebench.cli import main as cli
from decodebench.client import DecodebenchClient
from decodebench.commands.cure import summary
from decodebench.commands.submit import wait_for_sweep
from decodebench.formats.coreml.recipe import recipe_package
from scripts.stack import Stack, scratch_database

DEVICES = ["iphone-16-pro", "iphone-17-pro"]


def run(stack: Stack, package: Path, prompts: int, steps: int, out: Path) -> None:
    user = ["--server", stack.server_url, "--token", stack.tokens["user"]]
    started = time.monotonic()
    assert cli(["model", "upload", str(package), "--name", "smol-recipe", *user]) == 0
    print(f"upload: {time.monotonic() - started:.1f} s", flush=True)
    with DecodebenchClient(stack.server_url, stack.tokens["user"], timeout=300) as client:
        started = time.monotonic()
        request = {"package": "smol-recipe", "devices": DEVICES, "prompts": prompts, "steps": steps}
        job = client.submit_doctor(request)
        while (job := client.get_doctor(job.id)).state not in ("done", "failed"):
            stack.check_alive()
            time.sleep(2)
        assert job.started_at is not None and job.finished_at is not None
        worker_s = (job.finished_at - job.started_at).total_seconds()
        print(f"doctor job {job.state}: {time.monotonic() - started:.1f} s wall, {worker_s:.1f} s "
              "on the worker")  # fmt: skip
        if job.state == "failed":
            raise SystemExit(f"failed: {job.error}")
        print(summary(job))
        report = job.report
        assert report is not None
        layers = sorted({h.layer for h in report.headroom.overflows if h.layer is not None})
        print(f"overflowing layers: {layers}")
        for waste in report.waste:
            print(f"waste: {waste.what}: {waste.bytes_per_token:,} B/token; predicted after the "
                  f"fix: {waste.predicted_tok_s_after}")  # fmt: skip
        started = time.monotonic()
        assert job.sweep_id is not None
        sweep = wait_for_sweep(client, job.sweep_id, timeout_s=3600)
        print(f"A/B sweep {sweep.state}: {time.monotonic() - started:.1f} s")
        for row in client.get_doctor(job.id).ab:
            verdict = row.verdict.decode_tok_s if row.verdict else None
            judged = f"{verdict.label} ({verdict.ratio:.3f}x)" if verdict else "baseline"
            source = "SIMULATED" if row.simulated else "measured"
            print(f"  {row.device_class} {row.variant}: {row.decode_tok_s_mean:.1f} tok/s "
                  f"({source}), predicted {row.predicted_tok_s:.1f}; {judged}")  # fmt: skip
        client.download_repaired(job.id, out)
        print(f"repaired package: {out.stat().st_size:,} bytes")
    print(f"load average: {os.getloadavg()[0]:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--database", default="decodebench_bench_doctor")
    args = parser.parse_args()
    started = time.monotonic()
    package = recipe_package(fetch_model("smollm2-135m"), "state", 256)
    print(f"recipe package: {time.monotonic() - started:.1f} s", flush=True)
    broker = os.environ.get("DECODEBENCH_BENCH_BROKER_URL", "redis://127.0.0.1:6379/13")
    with (
        scratch_database(args.database) as database_url,
        tempfile.TemporaryDirectory(prefix="bench-doctor-") as var,
    ):
        stack = Stack(database_url=database_url, broker_url=broker, var_dir=Path(var))
        try:
            stack.prepare()
            stack.start_server("--no-access-log")
            stack.start_worker()
            stack.start_agent(DEVICES)
            run(stack, package, args.prompts, args.steps, Path(var) / "repaired.zip")
        finally:
            stack.stop()


if __name__ == "__main__":
    main()
