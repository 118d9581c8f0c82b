"""Predicted against measured decode speed on this CPU, cross-validated over 8 variants.

One model (default: qwen2.5-0.5b cut to 2 layers, seeded weights, context 256) is built in
fp16, w8, w4 and base, each with repeat_kv and folded attention; every package is decoded on the
host at its stored precision, in interleaved rounds (--rounds, median of each variant's
medians; agent.drivers.host.decode: the package's program, its linears on
PyTorch's fp16/int8/int4 CPU kernels or decompressed per block). The host profile is measured
in the same run (STREAM copy/triad, each kernel kind's byte rate on a synthetic matrix); the
step-time models of agent.drivers.host.profile are fitted on half the variants and predict the
other half. An error is |predicted / measured - 1| over the held-out variants.

    python -m bench.host_roofline --json
    python -m bench.host_roofline --model tiny-gqa --context 128 --json   # about a minute
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

from agent.drivers.host.decode import HostEngine
from agent.drivers.host.memory import stream_bandwidth
from agent.drivers.host.profile import (
    HostProfile,
    StepFeatures,
    abs_errors,
    fit,
    kernel_rates,
    kernel_seconds,
    predict,
    roofline_seconds,
)
from decodebench.building.build import build_variant
from decodebench.contracts.domain import VariantSpec

QUANTS = ("fp16", "w8", "w4", "base")
ATTENTIONS = ("repeat_kv", "folded")
GOAL_MEDIAN, GOAL_WORST = 0.10, 0.20


def measure_variant(package: Path, prompt_tokens: int, steps: int) -> tuple[StepFeatures, float]:
    """Weight bytes by kernel kind, and the median decode step time (seconds)."""
    engine = HostEngine(package)
    for position in range(prompt_tokens):
        engine.step(1 + position, position)
    seconds = []
    for position in range(prompt_tokens, prompt_tokens + steps):
        started = time.perf_counter()
        engine.step(7, position)
        seconds.append(time.perf_counter() - started)
    by_kind: dict[str, int] = {}
    for linear in engine.interpreter.linears.values():
        by_kind[linear.kind] = by_kind.get(linear.kind, 0) + linear.bytes_read
    features = StepFeatures(name=package.parent.name, bytes_by_kind=by_kind)
    del engine
    gc.collect()
    return features, statistics.median(seconds)


def evaluate(
    name: str, terms: list[float], seconds: list[float], calibration: list[bool], free_scale: bool
) -> tuple[list[float], float, float]:
    model = fit(
        name,
        [t for t, c in zip(terms, calibration, strict=True) if c],
        [s for s, c in zip(seconds, calibration, strict=True) if c],
        free_scale,
    )
    predicted = [predict(model, term) for term in terms]
    held = [(p, s) for p, s, c in zip(predicted, seconds, calibration, strict=True) if not c]
    errors = abs_errors([p for p, _ in held], [s for _, s in held])
    return predicted, statistics.median(errors), max(errors)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-0.5b")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--prompt-tokens", type=int, default=4)
    parser.add_argument("--steps", type=int, default=12, help="timed decode steps per variant")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved passes, median")
    parser.add_argument("--work", type=Path, default=Path("/tmp/host-roofline"))
    parser.add_argument("--json", action="store_true", help="print only the JSON object")
    args = parser.parse_args()

    started = time.perf_counter()
    packages = []
    for quant in QUANTS:
        for attention in ATTENTIONS:
            variant = VariantSpec(
                attention=attention, context=args.context, quant=quant, layers=args.layers
            )
            out = args.work / f"{attention}-{quant}"
            build_variant(args.model, variant, out)
            packages.append(out / "model.mlpackage")
    # Rounds interleave the variants, so a burst of load from elsewhere hits them all alike.
    timings: list[list[float]] = [[] for _ in packages]
    features: list[StepFeatures] = []
    for round_index in range(args.rounds):
        for index, package in enumerate(packages):
            step, seconds = measure_variant(package, args.prompt_tokens, args.steps)
            timings[index].append(seconds)
            if round_index == 0:
                features.append(step)
            if not args.json:
                print(f"round {round_index} {step.name:18s} {1 / seconds:8.2f} tok/s")
    rows = [(step, statistics.median(times)) for step, times in zip(features, timings, strict=True)]
    profile = HostProfile(bandwidth=stream_bandwidth(), kernel_bytes_per_s=kernel_rates())

    # Alternate the calibration set so each quantization and each layout is in both halves.
    calibration = [index % 2 == (index // 2) % 2 for index in range(len(rows))]
    seconds = [s for _, s in rows]
    roof_terms = [roofline_seconds(profile, f) for f, _ in rows]
    kernel_terms = [kernel_seconds(profile, f) for f, _ in rows]
    _, roof_median, roof_worst = evaluate("roofline", roof_terms, seconds, calibration, False)
    predicted, median, worst = evaluate("kernel_rates", kernel_terms, seconds, calibration, True)
    notes = []
    if roof_median > GOAL_MEDIAN or roof_worst > GOAL_WORST:
        notes.append(
            "the memory roofline alone misses: the weight kernels are compute-bound at batch 1 "
            "on this CPU (per-kind byte rates below STREAM bandwidth), so the profile adds each "
            "kernel kind's measured rate"
        )
    if median > GOAL_MEDIAN or worst > GOAL_WORST:
        notes.append(
            "with kernel rates the goal is still missed: the per-step work outside the weight "
            "kernels (attention over the cache, the interpreter's other ops) differs between "
            "layouts and is not modelled by weight bytes"
        )
    missing = "; ".join(notes) or None
    output = {
        "variants": [
            {
                "name": features.name,
                "predicted_tok_s": round(1 / p, 3),
                "measured_tok_s": round(1 / s, 3),
                "calibration_set": c,
                "weight_bytes_per_step": features.weight_bytes,
                "roofline_fraction": round(roof / s, 4),
            }
            for (features, s), p, c, roof in zip(
                rows, predicted, calibration, roof_terms, strict=True
            )
        ],
        "median_abs_error": round(median, 4),
        "worst_abs_error": round(worst, 4),
        "roofline_only": {
            "median_abs_error": round(roof_median, 4),
            "worst_abs_error": round(roof_worst, 4),
        },
        "missing_term": missing,
        "host": {
            "stream_triad_gb_s": round(profile.bandwidth.triad_bytes_per_s / 1e9, 2),
            "stream_copy_gb_s": round(profile.bandwidth.copy_bytes_per_s / 1e9, 2),
            "kernel_gb_s": {k: round(v / 1e9, 3) for k, v in profile.kernel_bytes_per_s.items()},
            "threads": profile.threads,
        },
        "model": f"{args.model}, {args.layers} layers, context {args.context}",
        "wall_seconds": round(time.perf_counter() - started, 1),
    }
    print(json.dumps(output, indent=None if args.json else 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
