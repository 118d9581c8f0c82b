"""Measured runs of a variant, made up with a known speed, time to first token and memory."""

from __future__ import annotations

import numpy as np

from decodebench.judging.measurements import PromptMeasurement, RunMeasurement, VariantRuns

PROMPTS = 30


def arm(
    name: str,
    *,
    speed: float = 1.0,
    ttft: float = 1.0,
    memory: int = 1_000_000,
    runs: int = 4,
    run_spread: float = 0.0,
    seed: int = 0,
    tokens: dict[int, list[int]] | None = None,
    device_class: str = "iphone-17-pro",
) -> VariantRuns:
    """Prompt p decodes at (20 + p) tok/s on the baseline; speed and ttft scale one side."""
    rng = np.random.default_rng(seed)
    measured = []
    for repetition in range(runs):
        offset = 1 + run_spread * rng.standard_normal()
        measured.append(
            RunMeasurement(
                repetition=repetition,
                device_udid="dev-1",
                peak_memory_bytes=memory,
                prompts=tuple(
                    PromptMeasurement(
                        prompt_index=p,
                        decode_tok_s=(20 + p) * speed * offset,
                        ttft_ms=(50 + 3 * p) * ttft / offset,
                        token_ids=None if tokens is None else tuple(tokens.get(p, [1, 2, 3, 4])),
                    )
                    for p in range(PROMPTS)
                ),
            )
        )
    return VariantRuns(variant=name, device_class=device_class, runs=tuple(measured))
