"""Every avoidable byte a decode step moves that the analysis recognises, with its fix.

Each :class:`Waste` says what moves, how many bytes per token it costs, the fix, and the
predicted tok/s per device class with those bytes gone (the analysis's one prediction,
:meth:`decodebench.contracts.profiles.DeviceProfile.predicted_tok_s`, on the total minus them):

- **tiles and repeats** (counted by the analysis): of K/V heads, fold (``decodebench fold``);
- **other pure copies** (transposes, broadcasts): fold them into their reader;
- **KV cache as inputs/outputs**: a cache input passed out again whole, updated, crosses memory
  in and out every step where a state is written one slice; the fix (Core ML states) needs the
  conversion's ``states=`` and a decode loop that keeps an ``MLState``, so it cannot be applied
  to the package alone;
- **fp32 islands**: values cast from fp16 to fp32, computed on and cast back; each fp32 value
  moves twice the bytes. Fix: compute in fp16 (for a norm, the overflow-safe rewrite);
- **full-context masks**: a mask input as long as the cache, passed every step; fix: build it in
  the graph from the position;
- **lm_head dominating the weights** (over a quarter of the bytes read): palettize it to 6 bits.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from coremltools.converters.mil.mil import types

from decodebench.analysis.analyze import analyze_mlpackage
from decodebench.contracts.analysis import GraphAnalysis
from decodebench.contracts.doctor import Waste
from decodebench.contracts.profiles import DEVICE_PROFILES
from decodebench.mil.interpreter import numpy_dtype
from decodebench.mil.program import load_package

LM_HEAD_SHARE = 0.25
PALETTE_BITS = 6
REPLICATIONS = ("tile", "repeat_concat", "repeat_gather")


def _bytes(var: Any) -> int:
    try:
        size = math.prod(int(dim) for dim in var.shape)
    except TypeError:
        return 0
    return size * numpy_dtype(var.dtype).itemsize


def _after(analysis: GraphAnalysis, saved: int) -> dict[str, float]:
    total = max(analysis.bytes_per_token.total - saved, 1)
    return {
        name: profile.predicted_tok_s(total, analysis.dispatch_ops)
        for name, profile in DEVICE_PROFILES.items()
    }


def _is_computed(var: Any) -> bool:
    return var.op is None or (
        var.op.op_type != "const" and not var.op.op_type.startswith("constexpr_")
    )


def find_waste(
    path: Path | str, analysis: GraphAnalysis | None = None, program: Any | None = None
) -> list[Waste]:
    """The wastes of the package at ``path`` (``program``: it, already loaded, not rewritten)."""
    analysis = analysis or analyze_mlpackage(path)
    program = program if program is not None else load_package(path).program
    function = program.functions.get(analysis.decode_function or "main") or next(
        iter(program.functions.values())
    )
    found: list[Waste] = []

    def add(kind: str, what: str, saved: int, fix: str, applicable: bool = False) -> None:
        if saved > 0:
            after = _after(analysis, saved)
            found.append(Waste(kind=kind, what=what, bytes_per_token=saved, fix=fix,
                               applicable=applicable, predicted_tok_s_after=after))  # fmt: skip

    copies = analysis.redundant_ops
    replicas = [copy for copy in copies if copy.kind in REPLICATIONS]
    others = [copy for copy in copies if copy.kind not in REPLICATIONS]
    add(
        "tiles and repeats",
        f"{len(replicas)} tile / repeat copies",
        sum(copy.moved_bytes for copy in replicas),
        "of K/V heads: fold the query instead (decodebench fold / repair); others: read the source",
        applicable=True,
    )
    add(
        "pure copies",
        f"{len(others)} transposes / broadcasts written and read again",
        sum(copy.moved_bytes for copy in others),
        "fold each into the op reading it",
    )
    outputs = list(function.outputs)
    cache_inputs = (
        [state.name for state in analysis.states] if analysis.kv_source == "inputs" else []
    )
    crossing = 0
    for name in cache_inputs:
        var = function.inputs.get(name)
        if var is not None:
            passed_out = [out for out in outputs if tuple(out.shape) == tuple(var.shape)]
            crossing += _bytes(var) + sum(_bytes(out) for out in passed_out[:1])
    add(
        "KV cache as I/O",
        f"{len(cache_inputs)} cache inputs passed in whole and out again every step",
        crossing,
        "make the caches Core ML states (convert with states=..., iOS 18) and keep an MLState "
        "in the decode loop: only the new K/V slice is written",
    )
    widened = [
        op
        for op in function.operations
        if op.op_type == "cast"
        and _is_computed(op.inputs["x"])
        and op.inputs["x"].dtype == types.fp16
        and op.outputs[0].dtype == types.fp32
    ]
    add(
        "fp32 islands",
        f"{len(widened)} fp16 values widened to fp32 and computed on",
        # Each fp32 copy is twice its fp16 bytes: the extra half written and read again.
        sum(_bytes(op.outputs[0]) for op in widened),
        "compute in fp16 where the headroom allows (norms: the overflow-safe rewrite)",
    )
    context = max((state.positions for state in analysis.states), default=0)
    masks = [
        var
        for var in function.inputs.values()
        if var.name not in cache_inputs
        and types.is_tensor(var.sym_type)
        and var.dtype in (types.fp16, types.fp32)
        and len(var.shape) >= 2
        and context
        and var.shape[-1] == context
    ]
    add(
        "full-context masks",
        f"{len(masks)} mask input(s) of {context} positions every step",
        sum(_bytes(var) for var in masks),
        "build the mask in the graph from the position input",
    )
    heads = [
        op.inputs["weight"]
        for op in function.operations
        if op.op_type == "linear" and any(out in outputs for out in op.outputs)
    ]
    head_bytes = sum(_bytes(weight) for weight in heads)
    weights = max(analysis.bytes_per_token.weights, 1)
    if head_bytes / weights > LM_HEAD_SHARE:
        bits = numpy_dtype(heads[0].dtype).itemsize * 8
        add(
            "lm_head dominates",
            f"the lm_head is {head_bytes / weights:.0%} of the weight bytes",
            int(head_bytes * (1 - PALETTE_BITS / bits)),
            f"palettize the lm_head to {PALETTE_BITS} bits",
        )
    return found


def _size(count: int) -> str:
    return f"{count / 2**20:,.2f} MiB" if count >= 2**20 else f"{count / 2**10:,.1f} KiB"


def render(found: list[Waste], analysis: GraphAnalysis) -> list[str]:
    lines = [f"avoidable bytes per token (of {analysis.bytes_per_token.total / 2**20:,.1f} MiB)"]
    if not found:
        lines.append("  none recognised")
    now = analysis.predicted_tok_s()
    for waste in found:
        rates = ", ".join(
            f"{device} {now.get(device, 0):.1f} -> {rate:.1f}"
            for device, rate in waste.predicted_tok_s_after.items()
        )
        lines.append(
            f"  {waste.kind}: {waste.what}: {_size(waste.bytes_per_token)}/token; "
            f"fix: {waste.fix}; predicted tok/s {rates}"
        )
    return lines
