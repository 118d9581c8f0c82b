"""Upload SmolLM2-135M-Instruct (the cached Hugging Face folder, 542 MB) to a real server, kill
the client half-way through model.safetensors, resume, and register it; prints the figures.

Starts its own server process on its own database (created afresh, then dropped); the model is
fetched once into the model cache (`decodebench model fetch smollm2-135m`).

    python -m bench.upload_smollm2 [--chunk-mib 8] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from decodebench.building.realmodels import fetch_model
from decodebench.client import DecodebenchClient
from decodebench.uploading import ResumeState, upload_model
from scripts.stack import Stack, scratch_database


class Killed(Exception):
    pass


def run(stack: Stack, folder: Path, chunk_bytes: int, state: Path) -> dict[str, object]:
    size = (folder / "model.safetensors").stat().st_size
    killed_at = 0

    def kill_half_way(name: str, offset: int, total: int) -> None:
        nonlocal killed_at
        if name == "model.safetensors" and offset >= size // 2 and not killed_at:
            killed_at = offset
            raise Killed

    with DecodebenchClient(stack.server_url, stack.tokens["user"], timeout=300) as client:
        started = time.perf_counter()
        try:
            upload_model(client, folder, "smollm2", chunk_bytes=chunk_bytes,
                         progress=kill_half_way, state=ResumeState(state))  # fmt: skip
        except Killed:
            pass
        first = time.perf_counter() - started
        notes: list[str] = []
        started = time.perf_counter()
        model = upload_model(client, folder, "smollm2", chunk_bytes=chunk_bytes,
                             log=notes.append, state=ResumeState(state))  # fmt: skip
        second = time.perf_counter() - started
    total = sum(entry.bytes for entry in model.files)
    return {
        "model_bytes": total,
        "files": [entry.path for entry in model.files],
        "architecture": model.architecture,
        "layers": model.summary.get("num_layers"),
        "parameters": model.summary.get("parameters"),
        "killed_at_byte": killed_at,
        "resume_notes": notes,
        "seconds_before_kill": round(first, 2),
        "seconds_after_resume": round(second, 2),
        "mb_per_s": round(total / 1e6 / (first + second), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one line of JSON")
    parser.add_argument("--chunk-mib", type=int, default=8)
    parser.add_argument("--database", default="decodebench_bench_upload")
    args = parser.parse_args()
    folder = fetch_model("smollm2-135m")
    with (
        scratch_database(args.database) as database_url,
        tempfile.TemporaryDirectory(prefix="bench-upload-") as var,
    ):
        stack = Stack(database_url=database_url, broker_url="memory://", var_dir=Path(var))
        try:
            stack.prepare()
            stack.start_server("--no-access-log")
            figures = run(stack, folder, args.chunk_mib * 2**20, Path(var) / "uploads.json")
            figures["chunk_mib"] = args.chunk_mib
            figures["load_average_1m"] = round(os.getloadavg()[0], 2)
        finally:
            stack.stop()
    print(json.dumps(figures) if args.json else json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
