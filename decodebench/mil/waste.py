"""Every avoidable byte a decode step moves that the analysis recognises, with its fix.

Each :class:`Waste` says what moves, how many bytes per token it costs, the fix, and the
predicted tok/s per device class with those bytes gone (the analysis's one prediction,
:meth:`decodebench.contracts.profiles.DeviceProfile.predicted_tok_s`, on the total minus them):

- **replicated K/V** (``tile``/repeat copies, counted by the analysis): fold (``decodebench fold``);
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

from pydantic import BaseModel, ConfigDict

from decodebench.analysis.analyze import analyze_mlpackage
from decodebench.contracts.analysis import GraphAnalysis
from decodebench.contracts.profiles import DEVICE_PROFILES
from decodebench.mil.interpreter import numpy_dtype
from decodebench.mil.program import load_package

LM_HEAD_SHARE = 0.25
PALETTE_BITS = 6


class Waste(BaseModel):
    model_config = ConfigDict(frozen=True)

    kind: str
    what: str
    bytes_per_token: int
    fix: str
    applicable: bool  # can `decodebench repair` apply the fix to the package itself?
    predicted_tok_s_after: dict[str, float]


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


def find_waste(path: Path | str, analysis: GraphAnalysis | None = None) -> list[Waste]:
    analysis = analysis or analyze_mlpackage(path)
    program = load_package(path).program
    function = program.functions.get(analysis.decode_function or "main") or next(
        iter(program.functions.values())
    )
    found: list[Waste] = []

    def add(kind: str, what: str, saved: int, fix: str, applicable: bool) -> None:
        if saved > 0:
            found.append(Waste(kind=kind, what=what, bytes_per_token=saved, fix=fix,
                               applicable=applicable, predicted_tok_s_after=_after(analysis, saved)))  # fmt: skip

    replicas = [copy for copy in analysis.redundant_ops if copy.kind in ("tile", "repeat_concat", "repeat_gather")]  # fmt: skip
    add("replicated K/V", f"{len(replicas)} copies of the KV heads",
        sum(copy.moved_bytes for copy in replicas),
        "fold the query instead (decodebench fold / repair)", True)  # fmt: skip
    others = [copy for copy in analysis.redundant_ops if copy not in replicas]
    add("pure copies", f"{len(others)} transposes / broadcasts written and read again",
        sum(copy.moved_bytes for copy in others), "fold each into the op reading it", False)  # fmt: skip

    outputs = list(function.outputs)
    cache_inputs = (
        [state.name for state in analysis.states] if analysis.kv_source == "inputs" else []
    )
    crossing = 0
    for name in cache_inputs:
        var = function.inputs.get(name)
        if var is None:
            continue
        same = [out for out in outputs if tuple(out.shape) == tuple(var.shape)]
        crossing += _bytes(var) + sum(_bytes(out) for out in same[:1])
    add("KV cache as I/O",
        f"{len(cache_inputs)} cache inputs passed in whole and out again every step", crossing,
        "make the caches Core ML states (convert with states=..., iOS 18) and keep an MLState in "
        "the decode loop: only the new K/V slice is written", False)  # fmt: skip

    island = 0
    count = 0
    for op in function.operations:
        if op.op_type != "cast" or not _is_computed(op.inputs["x"]):
            continue
        if str(op.inputs["dtype"].val) == "fp32" and op.inputs["x"].dtype.__name__ == "fp16":
            count += 1
            island += _bytes(op.outputs[0])  # the fp32 copy: twice the fp16 bytes, written and read
    add("fp32 islands", f"{count} fp16 values widened to fp32 and computed on", island,
        "compute in fp16 where the headroom allows (norms: the overflow-safe rewrite)", False)  # fmt: skip

    context = max((state.positions for state in analysis.states), default=0)
    masks = [
        var for var in function.inputs.values()
        if var.name not in cache_inputs and getattr(var, "shape", None)
        and len(var.shape) >= 2 and context and var.shape[-1] == context
        and var.dtype.__name__ in ("fp16", "fp32")
    ]  # fmt: skip
    add("full-context masks", f"{len(masks)} mask input(s) of {context} positions every step",
        sum(_bytes(var) for var in masks),
        "build the mask in the graph from the position input", False)  # fmt: skip

    heads = []
    for op in function.operations:
        if op.op_type == "linear" and any(out in outputs for out in op.outputs):
            heads.append(op.inputs["weight"])
    head_bytes = sum(_bytes(weight) for weight in heads)
    weights = max(analysis.bytes_per_token.weights, 1)
    if head_bytes and head_bytes / weights > LM_HEAD_SHARE:
        bits = numpy_dtype(heads[0].dtype).itemsize * 8
        saved = int(head_bytes * (1 - PALETTE_BITS / bits))
        add("lm_head dominates", f"the lm_head is {head_bytes / weights:.0%} of the weight bytes",
            saved, f"palettize the lm_head to {PALETTE_BITS} bits", False)  # fmt: skip
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
