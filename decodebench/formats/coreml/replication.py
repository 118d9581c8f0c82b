"""Find KV-head replication in a MIL graph and prove which query head reads which KV head.

A replicated tensor ``[B, Hq, X, Y]`` is traced back through data-movement ops (``tile``,
``expand_dims``, ``reshape``, ``squeeze``, ``transpose``, ``concat`` of one value with itself)
to the first tensor with fewer heads, ``[B, Hkv, X, Y]`` (or ``[B, Hkv, Y, X]``). The proof is
by execution: the chain runs on a tensor of element indices, and the result must be the source
with each head copied, head ``h`` reading KV head ``h // G`` (what ``repeat_kv``'s
expand+reshape produces) or ``h % Hkv`` (what ``x.repeat(1, G, 1, 1)`` or ``cat([x] * G, 1)``
produce). Any other order, or any mixing of positions and heads, is reported, never guessed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np

from decodebench.formats.coreml.ops import KERNELS, OpArgs

CHAIN_OPS = frozenset({"tile", "expand_dims", "reshape", "squeeze", "transpose", "concat"})
REPLICATING_OPS = frozenset({"tile", "concat"})


class HeadMapping(StrEnum):
    grouped = "h // G"  # query head h = G * kv + g
    interleaved = "h % Hkv"  # query head h = Hkv * g + kv


@dataclass
class Replication:
    """``replicated`` equals ``source`` with every KV head copied ``group`` times."""

    replicated: Any
    source: Any
    ops: list[Any]  # the chain, in program order (source first)
    mapping: HeadMapping
    kv_heads: int
    group: int
    swapped: bool  # source holds the last two axes in the other order

    @property
    def query_heads(self) -> int:
        return self.kv_heads * self.group


@dataclass
class Unproven:
    """A replication op feeds this tensor, but it cannot be shown to be a head replication."""

    replicated: Any
    ops: list[Any] = field(default_factory=list)
    reason: str = ""


def _shape(var: Any) -> tuple[int, ...] | None:
    shape = var.shape
    if all(isinstance(size, int | np.integer) for size in shape):
        return tuple(int(size) for size in shape)
    return None


def _chain_input(op: Any) -> Any | None:
    """The one tensor a chain op moves data from (None when it combines several)."""
    if op.op_type == "concat":
        values = list(op.inputs["values"])
        return values[0] if all(value is values[0] for value in values) else None
    return op.inputs["x"]


def _is_source_shape(candidate: tuple[int, ...], replicated: tuple[int, ...]) -> bool:
    if len(candidate) != 4 or candidate[0] != replicated[0]:
        return False
    heads, kv_heads = replicated[1], candidate[1]
    if not (0 < kv_heads < heads and heads % kv_heads == 0):
        return False
    return candidate[2:] in (replicated[2:], replicated[2:][::-1])


def trace_replication(var: Any) -> Replication | Unproven | None:
    """The head replication producing ``var``; None when no replicating op produces it."""
    replicated_shape = _shape(var)
    if replicated_shape is None or len(replicated_shape) != 4:
        return None
    chain: list[Any] = []
    current = var
    source = None
    while current.op is not None and current.op.op_type in CHAIN_OPS:
        data = _chain_input(current.op)
        if data is None:
            break
        chain.append(current.op)
        current = data
        shape = _shape(current)
        if shape is not None and _is_source_shape(shape, replicated_shape):
            source = current
            break
    chain.reverse()
    if not any(op.op_type in REPLICATING_OPS for op in chain):
        return None
    if source is None:
        return Unproven(var, chain, "the replication does not start from a [B, Hkv, ...] tensor")
    return _prove(var, source, chain, replicated_shape)


def _prove(
    var: Any, source: Any, chain: list[Any], replicated_shape: tuple[int, ...]
) -> Replication | Unproven:
    source_shape = _shape(source)
    assert source_shape is not None
    indices = np.arange(math.prod(source_shape), dtype=np.int32).reshape(source_shape)
    try:
        moved = run_chain(chain, indices)
    except Exception as error:  # a chain op we cannot replay is a chain we cannot prove
        return Unproven(var, chain, f"cannot replay the replication chain ({error})")
    heads, kv_heads = replicated_shape[1], source_shape[1]
    group = heads // kv_heads
    layouts = [(False, indices)]
    if source_shape[2:] != replicated_shape[2:] or source_shape[2] == source_shape[3]:
        layouts.append((True, np.swapaxes(indices, 2, 3)))
    for swapped, laid_out in layouts:
        if laid_out.shape[2:] != replicated_shape[2:]:
            continue
        for mapping in HeadMapping:
            kv_of_head = kv_index(mapping, heads, kv_heads)
            if np.array_equal(moved, laid_out[:, kv_of_head]):
                return Replication(var, source, chain, mapping, kv_heads, group, swapped)
    return Unproven(
        var, chain, "its heads are not copies of the KV heads in order h // G or h % Hkv"
    )


def kv_index(mapping: HeadMapping, heads: int, kv_heads: int) -> np.ndarray:
    """For each query head, the KV head it reads."""
    head = np.arange(heads)
    if mapping == HeadMapping.grouped:
        return head // (heads // kv_heads)
    return head % kv_heads


def run_chain(chain: list[Any], value: np.ndarray) -> np.ndarray:
    """Replay data-movement ops on ``value`` (other inputs are the ops' constants)."""
    for op in chain:
        data = _chain_input(op)
        arguments: dict[str, Any] = {}
        for name, var in op.inputs.items():
            if name == "values":
                arguments[name] = [value] * len(var)
            elif var is data:
                arguments[name] = value
            elif var.val is not None:
                arguments[name] = var.val
            else:
                raise ValueError(f"{op.op_type} '{op.name}' has a computed {name!r}")
        value = np.asarray(KERNELS[op.op_type](OpArgs(op, arguments)))
    return value
