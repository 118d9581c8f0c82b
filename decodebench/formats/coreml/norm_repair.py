"""Make every fp16 normalisation overflow-safe, staying in fp16.

For a norm over the last axis of ``v`` (``x`` for RMSNorm, ``x - mean(x)`` for LayerNorm):

    v · rsqrt(mean(v²) + eps)  =  (v/m) · rsqrt(mean((v/m)²) + eps/m²),   m = max|v| over the axis

exactly, for any m > 0. With ``v/m`` in [-1, 1] its square cannot overflow, and ``eps/m²`` keeps
eps at its true weight (coremltools' own ``rms_norm`` lowering adds eps to the scaled mean
unscaled, which is eps·m² on the true scale; this repair fixes that too). ``m`` is floored at
2^-14 (or sqrt(eps/1024), whichever is larger) so an all-zero row gives zeros instead of 0/0
and eps/m² stays finite; any m > 0 keeps the identity exact. The rewrite adds, per norm, ``abs``,
``reduce_max``, ``maximum``, ``real_div`` and two divisions of eps by m (one value per row): elementwise ops
over the hidden vector the analysis counts like any other.

Norms already computed in fp32 (their square declared fp32) are left as they are, and reported.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from coremltools.converters.mil import Builder as mb
from coremltools.converters.mil.mil import Program, types

from decodebench.contracts.doctor import NormRepair
from decodebench.formats.coreml.anatomy import describe
from decodebench.formats.coreml.fold import remove_dead
from decodebench.formats.coreml.norms import Norm, find_norms

SMALLEST_SCALE = 2.0**-14  # the smallest normal fp16 value


def _constant(value: float, like: Any) -> Any:
    dtype = np.float16 if like.dtype == types.fp16 else np.float32
    return np.array(value, dtype=dtype)


def _rewrite(norm: Norm, name: str) -> Any:
    """Build the safe chain before the old normalise op; returns its output."""
    before = norm.normalise
    operand = norm.square.inputs["x"] if norm.kind != "coreml_rms" else norm.source
    axes = [-1]
    magnitude = mb.abs(x=operand, name=f"{name}_abs", before_op=before)
    peak = mb.reduce_max(
        x=magnitude, axes=axes, keep_dims=True, name=f"{name}_max", before_op=before
    )
    # Floored so that eps / m² stays finite (at most 1024) on an all-zero row.
    floor = max(SMALLEST_SCALE, math.sqrt(norm.eps / 1024.0))
    scale = mb.maximum(x=peak, y=_constant(floor, operand), name=f"{name}_scale", before_op=before)
    scaled = mb.real_div(x=operand, y=scale, name=f"{name}_scaled", before_op=before)
    squared = mb.mul(x=scaled, y=scaled, name=f"{name}_square", before_op=before)
    mean = mb.reduce_mean(
        x=squared, axes=axes, keep_dims=True, name=f"{name}_mean", before_op=before
    )
    # eps / m², as (eps / m) / m: m² itself overflows once m passes 255.9.
    eps_over_scale = mb.real_div(
        x=_constant(norm.eps, operand), y=scale, name=f"{name}_eps_m", before_op=before
    )
    eps = mb.real_div(x=eps_over_scale, y=scale, name=f"{name}_eps", before_op=before)
    variance = mb.add(x=mean, y=eps, name=f"{name}_variance", before_op=before)
    if norm.root.op_type == "rsqrt" and norm.kind != "coreml_rms":
        epsilon = norm.root.inputs.get("epsilon")
        arguments = (
            {"epsilon": epsilon.val} if epsilon is not None and epsilon.val is not None else {}
        )
        root = mb.rsqrt(x=variance, name=f"{name}_rsqrt", before_op=before, **arguments)
        return mb.mul(x=scaled, y=root, name=f"{name}_normalised", before_op=before)
    root = mb.sqrt(x=variance, name=f"{name}_sqrt", before_op=before)
    return mb.real_div(x=scaled, y=root, name=f"{name}_normalised", before_op=before)


def _reason_to_leave(norm: Norm) -> str | None:
    if norm.square.outputs[0].dtype != types.fp16:
        return "computed in fp32 already"
    if norm.kind != "coreml_rms":
        normalised = norm.normalise.inputs
        reads = [var for key, var in normalised.items() if key in ("x", "y")]
        if norm.square.inputs["x"] not in reads and not any(
            var is norm.square.inputs["x"] for var in reads
        ):
            return "the square and the normalisation read different values (casts between)"
    return None


def repair_norms(program: Program) -> list[NormRepair]:
    """Rewrite every fp16 norm of ``program`` in place; one entry per norm found."""
    done: list[NormRepair] = []
    for function_name, function in program.functions.items():
        places = describe(function)
        for index, norm in enumerate(find_norms(function)):
            place = places.get(norm.square.name)
            label = place.label.rsplit(" · ", 1)[0] if place else f"norm {index}"
            reason = _reason_to_leave(norm)
            if reason is None:
                with function:
                    output = _rewrite(norm, f"{norm.square.name}_safe")
                    old = norm.normalise.outputs[0]
                    function.replace_uses_of_var_after_op(
                        anchor_op=norm.normalise, old_var=old, new_var=output
                    )
                remove_dead(function, [norm.normalise, *reversed(norm.ops())])
            done.append(
                NormRepair(
                    function=function_name,
                    label=label,
                    kind=norm.kind,
                    square_op=norm.square.name,
                    status="left" if reason else "rewritten",
                    reason=reason,
                )
            )
    return done
