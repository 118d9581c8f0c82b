"""The host's device profile, measured, and the decode-time model it predicts with.

Two models of a decode step's time, both fitted on a calibration set and judged on held-out
variants:

- ``roofline``: ``t = overhead + weight_bytes / STREAM triad bandwidth`` (the memory roofline;
  only the per-step overhead is fitted);
- ``kernel_rates``: ``t = overhead + scale * sum(bytes_k / rate_k)``, where ``rate_k`` is the
  bytes per second this CPU's kernel of kind ``k`` (fp16, int8, int4, blockwise) actually
  sustains, measured on a synthetic matrix: a weight-only low-bit kernel at batch 1 can be
  bound by its unpacking arithmetic rather than by memory, a term the roofline lacks.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from types import SimpleNamespace

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field

from agent.drivers.host.memory import StreamBandwidth
from decodebench.formats.coreml.host_kernels import (
    BlockwiseLinear,
    Fp16Linear,
    Int4Linear,
    Int8Linear,
    PackedLinear,
)

PROBE_ROWS = 8192
PROBE_COLUMNS = 1024
PROBE_REPEATS = 7


def _probe_kernels() -> dict[str, PackedLinear]:
    """One synthetic weight per kernel kind, shaped like a small model's projection."""
    generator = np.random.default_rng(0)
    shape = (PROBE_ROWS, PROBE_COLUMNS)
    int4 = generator.integers(-8, 8, shape, dtype=np.int8)
    scale = generator.random((PROBE_ROWS, PROBE_COLUMNS // 32), dtype=np.float32) + 0.5
    lut_op = SimpleNamespace(
        op_type="constexpr_lut_to_dense",
        inputs={
            "indices": SimpleNamespace(val=generator.integers(0, 64, shape, dtype=np.uint8)),
            "lut": SimpleNamespace(val=generator.random((1, 1, 64, 1)).astype(np.float16)),
        },
    )
    return {
        "fp16": Fp16Linear(generator.random(shape, dtype=np.float32).astype(np.float16), None),
        "int8": Int8Linear(generator.integers(-128, 128, shape, dtype=np.int8), scale[:, :1], None),
        "int4": Int4Linear(int4, scale, None),
        "blockwise": BlockwiseLinear(lut_op, None, PROBE_ROWS),
    }


def kernel_rates(repeats: int = PROBE_REPEATS) -> dict[str, float]:
    """Bytes of weight per second each kernel kind sustains at batch 1 (median of repeats)."""
    x = np.random.default_rng(1).random((1, PROBE_COLUMNS), dtype=np.float32)
    rates = {}
    for kind, kernel in _probe_kernels().items():
        kernel(x)
        seconds = []
        for _ in range(repeats):
            started = time.perf_counter()
            kernel(x)
            seconds.append(time.perf_counter() - started)
        rates[kind] = kernel.bytes_read / statistics.median(seconds)
    return rates


class HostProfile(BaseModel):
    """What this machine sustains: STREAM bandwidth and each weight kernel's byte rate."""

    model_config = ConfigDict(frozen=True)

    bandwidth: StreamBandwidth
    kernel_bytes_per_s: dict[str, float]
    threads: int = Field(default_factory=torch.get_num_threads)


class StepFeatures(BaseModel):
    """What a variant's decode step reads, by kernel kind."""

    model_config = ConfigDict(frozen=True)

    name: str
    bytes_by_kind: dict[str, int]

    @property
    def weight_bytes(self) -> int:
        return sum(self.bytes_by_kind.values())


def roofline_seconds(profile: HostProfile, step: StepFeatures) -> float:
    return step.weight_bytes / profile.bandwidth.triad_bytes_per_s


def kernel_seconds(profile: HostProfile, step: StepFeatures) -> float:
    return sum(
        size / min(profile.kernel_bytes_per_s[kind], profile.bandwidth.triad_bytes_per_s)
        for kind, size in step.bytes_by_kind.items()
    )


class FittedModel(BaseModel):
    """``t = overhead + scale * term(variant)``, fitted by least squares on a calibration set."""

    name: str
    overhead_s: float
    scale: float


def fit(
    name: str, terms: Sequence[float], seconds: Sequence[float], free_scale: bool
) -> FittedModel:
    """Least squares for overhead (and scale when free); the overhead is kept non-negative."""
    term = np.asarray(terms)
    measured = np.asarray(seconds)
    if free_scale and len(set(terms)) > 1:
        scale, overhead = np.polyfit(term, measured, 1)
        if overhead < 0:
            overhead, scale = 0.0, float(term @ measured / (term @ term))
    else:
        scale, overhead = 1.0, float(np.mean(measured - term))
    return FittedModel(name=name, overhead_s=max(float(overhead), 0.0), scale=float(scale))


def predict(model: FittedModel, term: float) -> float:
    return model.overhead_s + model.scale * term


def abs_errors(predicted: Sequence[float], measured: Sequence[float]) -> list[float]:
    return [abs(p / m - 1) for p, m in zip(predicted, measured, strict=True)]
