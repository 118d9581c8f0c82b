"""The engine held to Apple's runtime, op by op.

Apple's runtime computes every value of a function once (:func:`runtime.probe`); the engine
then runs each operation on *the runtime's* values of its operands, so each op is judged alone
and an error never carries forward. An op agrees when its result equals the runtime's within
its tolerance: none for an fp16 result of arithmetic (rounding to the declared type is exact;
fp16 matrix products use the runtime's own order, :func:`kernels.sequential_fp16_matmul`), one
fp16 ulp for an fp16 result of a library function (``exp``, ``silu``: see TRANSCENDENTAL), and
a relative 1e-5 for an fp32 result (a reduction may sum in another order). The first op beyond
it is named. Ops the engine folds once (on constants only: a weight's dequantization, its
transpose) are held like the others.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from decodebench.formats.coreai import runtime
from decodebench.formats.coreai.engine import Engine, declared
from decodebench.formats.coreai.kernels import MATMULS, sequential_fp16_matmul
from decodebench.formats.coreai.program import CoreAIError, Function, Program
from decodebench.formats.seam import ReferenceDisagreement

# fp32 results: relative to the largest magnitude of the result (a reduction's order).
FP32_RELATIVE = 1e-5
# Kinds whose fp32 value comes from a library function (exp, log, ...): two libraries may differ
# by an fp32 ulp, which can carry a value across an fp16 rounding boundary, so such an fp16
# result may differ by one fp16 ulp of itself. Every other fp16 result must be the same bits.
TRANSCENDENTAL = frozenset(
    {
        "exp", "exp2", "log", "sqrt", "rsqrt", "reciprocal", "tanh", "sin", "cos", "sigmoid",
        "silu", "gelu", "erf", "softplus", "softmax", "pow", "broadcasting_pow",
    }
)  # fmt: skip


class Disagreement(CoreAIError, ReferenceDisagreement):
    """The engine and Apple's runtime computed different values for one op."""


@dataclass
class OpAgreement:
    ops: int = 0
    exact: int = 0
    by_kind: Counter[str] = field(default_factory=Counter)
    worst: dict[str, float] = field(default_factory=dict)  # kind -> largest relative difference


def _difference(mine: np.ndarray, theirs: np.ndarray) -> tuple[float, float]:
    if mine.size == 0:
        return 0.0, 0.0
    if mine.dtype.kind != "f":
        return (0.0 if np.array_equal(mine, theirs) else float("inf")), 1.0
    both_nan = np.isnan(mine) & np.isnan(theirs)
    same_inf = np.isinf(mine) & (mine == theirs)
    with np.errstate(invalid="ignore", over="ignore"):
        gap = np.where(both_nan | same_inf, 0.0, np.abs(mine - theirs))
    gap = np.nan_to_num(gap, nan=np.inf)
    scale = float(np.max(np.abs(theirs[np.isfinite(theirs)]), initial=0.0)) or 1.0
    return float(np.max(gap)), scale


def _beyond_one_ulp(mine: np.ndarray, theirs: np.ndarray) -> float:
    """The largest fp16 difference beyond one fp16 ulp of the runtime's value (0 if none)."""
    ulp = np.spacing(np.abs(theirs).astype(np.float16)).astype(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        excess = np.nan_to_num(np.abs(mine - theirs) - ulp, nan=np.inf)
    excess[np.isnan(mine) & np.isnan(theirs)] = 0.0
    return float(max(np.max(excess), 0.0))


def hold_to_runtime(
    program: Program, function: Function, feeds: Mapping[str, np.ndarray]
) -> OpAgreement:
    """Every op of ``function`` against Apple's runtime on ``feeds``; Disagreement naming the
    first op that differs beyond its tolerance."""
    theirs = runtime.probe(program, function, feeds)
    engine = Engine(function, check_finite=False)
    values: dict[str, np.ndarray] = dict(engine.constants)
    for name, key in function.inputs.items():
        values[key] = declared(np.asarray(feeds[name]), function.input_types[name])
    report = OpAgreement()
    # The folded ops (a weight's dequantization, its transpose) are held too, in program order.
    held_steps = sorted(engine.folded + engine.steps, key=lambda step: step.operation.index)
    for step in held_steps:
        arguments = [values[key] for key in step.operands]
        value_type = step.types[0]
        exact_matmul = step.operation.kind in MATMULS and value_type.dtype == "float16"
        kernel = sequential_fp16_matmul if exact_matmul else step.kernel
        mine = declared(kernel(arguments), value_type)
        held = declared(theirs[step.results[0]], value_type)
        kind = step.operation.kind
        gap, scale = _difference(mine, held)
        tolerance = FP32_RELATIVE * scale if value_type.dtype == "float32" else 0.0
        if value_type.dtype == "float16" and kind in TRANSCENDENTAL and gap > 0:
            gap = _beyond_one_ulp(mine, held)
        report.ops += 1
        report.by_kind[kind] += 1
        report.exact += gap == 0.0
        report.worst[kind] = max(report.worst.get(kind, 0.0), gap / scale)
        if gap > tolerance:
            raise Disagreement(
                f"{program.path.name}: op #{step.operation.index} {step.operation.name!r} "
                f"({kind} -> {value_type.dtype}{list(value_type.shape or ())}) differs from "
                f"Apple's runtime by {gap:.6g} (largest |value| {scale:.6g}, tolerance "
                f"{tolerance:.3g})"
            )
        values[step.results[0]] = held  # the next op reads the runtime's value
    return report
