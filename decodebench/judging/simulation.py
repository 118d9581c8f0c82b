"""Sweeps measured on stand-in devices: the simulated driver's timing model, run by run.

Used by the statistics tests and `bench/regression_detection.py` to put the judge in front of
noise that looks like a phone's (docs/noise-model.md), without a server: the per-run timings
come from `decodebench.timing.simulate_decode`, the code the simulated driver runs.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from decodebench.contracts.profiles import DeviceProfile
from decodebench.judging.measurements import PromptMeasurement, RunMeasurement, VariantRuns
from decodebench.prompts import builtin_prompts
from decodebench.timing import TimingParameters, simulate_decode


class SimulatedDesign(BaseModel):
    """How a simulated sweep is laid out: prompts × decode tokens × A B B A repetitions."""

    model_config = ConfigDict(frozen=True)

    prompts: int = Field(default=30, ge=1, le=30)
    decode_tokens: int = Field(default=32, ge=1)
    repetitions: int = Field(default=4, ge=1)
    package_bytes: int = Field(default=1_200_000_000, ge=1)

    def prompt_tokens(self) -> list[int]:
        return [prompt.token_count for prompt in builtin_prompts(self.prompts)]


def simulated_run(
    profile: DeviceProfile,
    timing: TimingParameters,
    design: SimulatedDesign,
    bytes_per_token: int,
    udid: str,
    run_id: int,
    repetition: int,
    prompt_tokens: Sequence[int],
    thermal_state: str = "nominal",
) -> RunMeasurement:
    run = simulate_decode(
        profile,
        timing,
        bytes_per_token,
        udid,
        run_id,
        prompt_tokens,
        design.decode_tokens,
        thermal_state,
    )
    decode_tok_s = design.decode_tokens / run.latencies_s.sum(axis=1)
    ttft_ms = (run.prefill_s + run.latencies_s[:, 0]) * 1000
    return RunMeasurement(
        repetition=repetition,
        device_udid=udid,
        peak_memory_bytes=timing.peak_memory_bytes(design.package_bytes),
        prompts=tuple(
            PromptMeasurement(prompt_index=index, decode_tok_s=rate, ttft_ms=ttft)
            for index, rate, ttft in zip(
                range(len(prompt_tokens)), decode_tok_s.tolist(), ttft_ms.tolist(), strict=True
            )
        ),
    )


def simulated_pair(
    profile: DeviceProfile,
    timing: TimingParameters,
    design: SimulatedDesign,
    bytes_per_token: int,
    speedup: float,
    *,
    seed: int,
    udid: str = "sim-judge-0",
) -> tuple[VariantRuns, VariantRuns]:
    """Baseline A and variant B (decoding `speedup` times faster) on one device, A B B A.

    Each run gets its own run id, so its run offset and token noise are its own draw.
    """
    prompt_tokens = design.prompt_tokens()
    variant_bytes = max(1, round(bytes_per_token / speedup))
    runs: dict[str, list[RunMeasurement]] = {"A": [], "B": []}
    run_id = seed * 1000
    for repetition in range(design.repetitions):
        order = ("A", "B") if repetition % 2 == 0 else ("B", "A")
        for arm in order:
            run_id += 1
            runs[arm].append(
                simulated_run(
                    profile,
                    timing,
                    design,
                    bytes_per_token if arm == "A" else variant_bytes,
                    udid,
                    run_id,
                    repetition,
                    prompt_tokens,
                )
            )
    device_class = profile.device_class
    return (
        VariantRuns(variant="A", device_class=device_class, runs=tuple(runs["A"])),
        VariantRuns(variant="B", device_class=device_class, runs=tuple(runs["B"])),
    )


def nightly_value(
    profile: DeviceProfile,
    timing: TimingParameters,
    design: SimulatedDesign,
    bytes_per_token: int,
    udid: str,
    first_run_id: int,
    prompt_tokens: Sequence[int],
) -> float:
    """One night's figure for a series: the mean decode tok/s over every prompt of the
    `design.repetitions` runs of one variant, each run a fresh draw of the noise model."""
    rates = []
    for run_id in range(first_run_id, first_run_id + design.repetitions):
        run = simulate_decode(
            profile, timing, bytes_per_token, udid, run_id, prompt_tokens, design.decode_tokens
        )
        rates.append(design.decode_tokens / run.latencies_s.sum(axis=1))
    return float(np.mean(rates))
