"""Diagnose SmolLM2-135M converted by Apple's Llama recipe: fp16 headroom by layer and role, the
first overflow, and the avoidable bytes per token of both KV layouts.

    python -m bench.smollm2_doctor                  # 30 chat prompts x 16 greedy steps
    python -m bench.smollm2_doctor --prompts 5 --steps 16

The packages are converted once (decodebench/formats/coreml/recipe.py, cached under
~/.cache/decodebench/recipe). Prints the headroom report (the fp32 run's largest |value| per op
against 65,504, on how many prompts), the waste list of the state and the KV-as-I/O packages
(with the CPU time of the analysis and of the waste list on top of it), and CPU seconds per
decode step of the fp32 recording run with the load average around it.
"""

from __future__ import annotations

import argparse
import os
import time

from decodebench.analysis.analyze import analyze_graphs
from decodebench.building.realmodels import fetch_model
from decodebench.doctor.headroom import measure_headroom, render
from decodebench.doctor.waste import find_waste
from decodebench.doctor.waste import render as render_waste
from decodebench.formats.coreml.program import quiet_coremltools
from decodebench.formats.coreml.recipe import recipe_package
from decodebench.prompts import CHAT_PROMPT_COUNT, chat_prompts, chat_token_ids


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=CHAT_PROMPT_COUNT)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--context", type=int, default=256)
    args = parser.parse_args()

    weights = fetch_model("smollm2-135m")
    texts = [prompt.text for prompt in chat_prompts(args.prompts)]
    prompts = chat_token_ids(weights, texts)
    with quiet_coremltools():
        state = recipe_package(weights, "state", args.context)
        io = recipe_package(weights, "io", args.context)
        load_before = os.getloadavg()
        cpu_before, wall_before = time.process_time(), time.perf_counter()
        report = measure_headroom(state, prompts, args.steps)
        cpu = time.process_time() - cpu_before
        wall = time.perf_counter() - wall_before
        load_after = os.getloadavg()
        print("\n".join(render(report)))
        overflowing = sorted({h.layer for h in report.overflows if h.layer is not None})
        print(f"layers with an overflowing op: {len(overflowing)} ({overflowing})")
        for label, package in (("state", state), ("io", io)):
            cpu_before = time.process_time()
            analysis, graphs = analyze_graphs(package)
            cpu_analysis = time.process_time() - cpu_before
            waste = find_waste(package, analysis, graphs)
            cpu_waste = time.process_time() - cpu_before - cpu_analysis
            print(f"{label} layout: " + "\n".join(render_waste(waste, analysis)))
            print(
                f"  analysis {cpu_analysis * 1000:.0f} ms CPU, waste list {cpu_waste * 1000:.1f} ms"
                f" CPU more (load average {os.getloadavg()[0]:.2f})"
            )
    steps = sum(len(prompt) + args.steps - 1 for prompt in prompts)
    print(
        f"measure: {len(prompts)} prompts, {steps} steps per run (fp32 recording + fp16), "
        f"{cpu:.1f} s CPU, {wall:.1f} s wall, {cpu / steps * 1000:.0f} ms CPU per step; "
        f"load average {load_before[0]:.2f} -> {load_after[0]:.2f} (1 min)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
