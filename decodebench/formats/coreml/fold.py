"""The GQA fold: remove KV-head replication from a MIL program by grouping the queries instead.

``fold_program(program)`` rewrites every attention that reads replicated K/V (see
:mod:`decodebench.formats.coreml.attention`) so K and V are read at their stored ``Hkv`` heads (docs/architecture.md):

- ``h // G``: ``Q [B, Hq, L, D] -> reshape [B, Hkv, G·L, D]`` (row ``g·L + l`` of KV head ``kv`` is
  query head ``G·kv + g`` at position ``l``), and the output reshapes back;
- ``h % Hkv``: the same after moving the group axis in front of the KV axis with a transpose
  (``[G, Hkv, L, D] -> [Hkv, G, L, D]``), undone on the output;
- prefill (``L > 1``) keeps rank 4 by merging group and query axes; a side input that varies
  along the query axis (the causal mask) is tiled ``G`` times along it once, shared by every
  layer that reads it.

Patterns that cannot be proven exact are left untouched and reported with the reason. The pass
is registered with coremltools as ``decodebench::fold_gqa``, so it can run inside ``ct.convert``::

    pipeline = ct.PassPipeline.DEFAULT
    pipeline.append_pass("decodebench::fold_gqa")
    ct.convert(traced, ..., pass_pipeline=pipeline)
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

from coremltools.converters.mil import Builder as mb
from coremltools.converters.mil.mil import Program
from coremltools.converters.mil.mil.passes.graph_pass import AbstractGraphPass
from coremltools.converters.mil.mil.passes.pass_registry import register_pass

from decodebench.contracts.doctor import FoldReport, PatternReport
from decodebench.formats.coreml.attention import Attention, find_attentions
from decodebench.formats.coreml.interpreter import numpy_dtype
from decodebench.formats.coreml.replication import HeadMapping, Replication

PASS_NAME = "decodebench::fold_gqa"
logger = logging.getLogger(__name__)


def fold_program(program: Program) -> FoldReport:
    """Fold every provably exact pattern in place; the others stay as they are."""
    patterns: list[PatternReport] = []
    stray: list[str] = []
    before = _op_counts(program)
    alignments: list[str] = []
    for function_name, function in program.functions.items():
        attentions, stray_ops = find_attentions(function)
        stray += [f"{function_name}/{op.name}" for op in stray_ops]
        rewriter = _Rewriter(function)
        for attention in attentions:
            if not attention.refused:
                existing = {id(op) for op in function.operations}
                try:
                    with function:
                        rewriter.rewrite(attention)
                except Exception as error:  # a refusal, not a crash
                    # coremltools rejected a rebuilt op (an input combination its type
                    # inference does not accept): undo what was added, keep the original.
                    rewriter.undo(existing)
                    attention.refuse(f"rewrite failed, pattern left as is: {error}")
            patterns.append(_pattern_report(function_name, attention))
        alignments += rewriter.alignments
    after = _op_counts(program)
    return FoldReport(
        patterns=patterns,
        stray_replications=stray,
        removed_ops={k: before[k] - after.get(k, 0) for k in before if before[k] > after.get(k, 0)},
        added_ops={k: after[k] - before.get(k, 0) for k in after if after[k] > before.get(k, 0)},
        mask_alignments=alignments,
    )


@register_pass(namespace="decodebench", name="fold_gqa")
class FoldGqaPass(AbstractGraphPass):
    """coremltools graph pass wrapper of :func:`fold_program` (the report is kept and logged)."""

    def __init__(self) -> None:
        super().__init__()
        self.report: FoldReport | None = None

    def apply(self, prog: Program) -> None:
        self.report = fold_program(prog)
        logger.info(
            "fold_gqa: %d patterns, %d rewritten, %d refused",
            self.report.found,
            self.report.rewritten,
            self.report.refused,
        )
        for pattern in self.report.patterns:
            if pattern.status == "refused":
                logger.warning(
                    "fold_gqa refused %s: %s", pattern.score_op, "; ".join(pattern.reasons)
                )


def _op_counts(program: Program) -> dict[str, int]:
    counts: dict[str, int] = {}
    for function in program.functions.values():
        for op in function.operations:
            counts[op.op_type] = counts.get(op.op_type, 0) + 1
    return counts


def _var_bytes(var: Any) -> int:
    try:
        return math.prod(int(size) for size in var.shape) * numpy_dtype(var.dtype).itemsize
    except TypeError:
        return 0


def _pattern_report(function_name: str, attention: Attention) -> PatternReport:
    replications = [r for r in (attention.key, attention.value) if r is not None]
    chain_ops = [op for replication in replications for op in replication.ops]
    proven = [r for r in replications if isinstance(r, Replication)]
    try:
        shape: tuple[int, ...] | None = attention.shape
    except (TypeError, ValueError):
        shape = None
    return PatternReport(
        function=function_name,
        kind="sdpa" if attention.kind == "sdpa" else "matmul",
        score_op=attention.anchor.name,
        output_op=attention.output_op.name,
        query_heads=shape[1] if shape else None,
        kv_heads=proven[0].kv_heads if proven else None,
        query_length=shape[2] if shape else None,
        head_mapping=proven[0].mapping.value if proven else None,
        replication_ops=[f"{op.op_type} '{op.name}'" for op in chain_ops],
        replicated_bytes=sum(
            _var_bytes(op.outputs[0]) for op in chain_ops if op.op_type in ("tile", "concat")
        ),
        status="refused" if attention.refused else "rewritten",
        reasons=list(attention.reasons),
    )


class _Rewriter:
    """Rewrites patterns of one block; side inputs aligned once are shared across patterns."""

    def __init__(self, block: Any) -> None:
        self.block = block
        self.aligned: dict[int, Any] = {}
        self._notes: dict[int, str] = {}

    @property
    def alignments(self) -> list[str]:
        return [self._notes[key] for key in self.aligned]

    def undo(self, existing: set[int]) -> None:
        """Remove the ops added since ``existing`` was taken (none of them is used yet)."""
        added = [op for op in self.block.operations if id(op) not in existing]
        for op in reversed(added):
            if not any(var.child_ops for var in op.outputs):
                self.block.remove_ops([op])
        alive = {id(var) for op in self.block.operations for var in op.outputs}
        self.aligned = {key: var for key, var in self.aligned.items() if id(var) in alive}

    def rewrite(self, attention: Attention) -> None:
        key, value = attention.key, attention.value
        assert isinstance(key, Replication) and isinstance(value, Replication)
        anchor_op, output_op = attention.anchor, attention.output_op
        shape = _Shape(*attention.shape, kv_heads=key.kv_heads, group=key.group)
        # The query and K exist before the anchor; everything reading values the anchor or the
        # ops between the matmuls produce goes just before the output op.
        grouped_query = _group_query(
            attention.query, key.mapping, shape, f"{anchor_op.name}_gqa", anchor_op
        )
        if attention.kind == "sdpa":
            arguments = {"query": grouped_query, "key": key.source, "value": value.source}
            mask = anchor_op.inputs.get("attn_mask")
            if mask is not None:
                arguments["attn_mask"] = self._side(attention, mask, shape, anchor_op)
            grouped_output = mb.scaled_dot_product_attention(
                **arguments, name=f"{anchor_op.name}_gqa", before_op=anchor_op
            )
        else:
            grouped_output = self._rewrite_matmuls(attention, grouped_query, shape)
        result = _ungroup_output(
            grouped_output, key.mapping, shape, f"{output_op.name}_gqa_out", output_op
        )
        self.block.replace_uses_of_var_after_op(
            anchor_op=output_op, old_var=output_op.outputs[0], new_var=result
        )
        remove_dead(self.block, [output_op, *attention.region, anchor_op, *key.ops, *value.ops])

    def _rewrite_matmuls(self, attention: Attention, grouped_query: Any, shape: _Shape) -> Any:
        key, value = attention.key, attention.value
        assert isinstance(key, Replication) and isinstance(value, Replication)
        anchor_op, output_op = attention.anchor, attention.output_op
        mapped: dict[int, Any] = {
            id(anchor_op.outputs[0]): mb.matmul(
                x=grouped_query,
                y=key.source,
                transpose_x=False,
                transpose_y=bool(anchor_op.inputs["transpose_y"].val) != key.swapped,
                name=f"{anchor_op.name}_gqa",
                before_op=anchor_op,
            )
        }

        def rebuilt(var: Any) -> Any:
            if id(var) in mapped:
                return mapped[id(var)]
            return self._side(attention, var, shape, output_op)

        for op in attention.region:
            arguments = {
                name: [rebuilt(item) for item in var]
                if isinstance(var, list | tuple)
                else rebuilt(var)
                for name, var in op.inputs.items()
            }
            builder = getattr(mb, op.op_type)
            mapped[id(op.outputs[0])] = builder(
                **arguments, name=f"{op.name}_gqa", before_op=output_op
            )
        return mb.matmul(
            x=mapped[id(output_op.inputs["x"])],
            y=value.source,
            transpose_x=False,
            transpose_y=bool(output_op.inputs["transpose_y"].val) != value.swapped,
            name=f"{output_op.name}_gqa",
            before_op=output_op,
        )

    def _side(self, attention: Attention, var: Any, shape: _Shape, before_op: Any) -> Any:
        """A side input as the grouped scores need it: tiled along the query axis if it varies."""
        if id(var) not in attention.side_inputs:
            return var
        if id(var) not in self.aligned:
            # Placed before the first op reading it; later layers come later in the program.
            dims = tuple(int(size) for size in var.shape)
            source = var
            if len(dims) != 4:
                source = mb.reshape(
                    x=var,
                    shape=[1] * (4 - len(dims)) + list(dims),
                    before_op=before_op,
                    name=f"{var.name}_gqa_rank4",
                )
            self.aligned[id(var)] = mb.tile(
                x=source,
                reps=[1, 1, shape.group, 1],
                name=f"{var.name}_gqa_aligned",
                before_op=before_op,
            )
            self._notes[id(var)] = (
                f"'{var.name}' tiled {shape.group}x along the query axis to match the merged "
                f"group x query rows (once, shared by every pattern reading it)"
            )
        return self.aligned[id(var)]


@dataclass(frozen=True)
class _Shape:
    batch: int
    heads: int
    length: int
    dim: int
    kv_heads: int
    group: int


def _group_query(query: Any, mapping: HeadMapping, shape: _Shape, name: str, before_op: Any) -> Any:
    """[B, Hq, L, D] -> [B, Hkv, G·L, D], row g·L + l of KV head kv holding its query head."""
    b, kv, g, length, d = shape.batch, shape.kv_heads, shape.group, shape.length, shape.dim
    if mapping == HeadMapping.grouped:  # h = G·kv + g: a pure reshape
        return mb.reshape(x=query, shape=[b, kv, g * length, d], name=name, before_op=before_op)
    if length == 1:  # h = Hkv·g + kv: [1, Hq, 1, D] = [1, G, Hkv, D] -> [1, Hkv, G, D]
        split = mb.reshape(x=query, shape=[b, g, kv, d], name=f"{name}_split", before_op=before_op)
        return mb.transpose(x=split, perm=[0, 2, 1, 3], name=name, before_op=before_op)
    split = mb.reshape(x=query, shape=[g, kv, length, d], name=f"{name}_split", before_op=before_op)
    swapped = mb.transpose(x=split, perm=[1, 0, 2, 3], name=f"{name}_swap", before_op=before_op)
    return mb.reshape(x=swapped, shape=[1, kv, g * length, d], name=name, before_op=before_op)


def _ungroup_output(
    output: Any, mapping: HeadMapping, shape: _Shape, name: str, before_op: Any
) -> Any:
    """The inverse of :func:`_group_query` on the attention output."""
    b, kv, g, length, d = shape.batch, shape.kv_heads, shape.group, shape.length, shape.dim
    heads = shape.heads
    if mapping == HeadMapping.grouped:
        return mb.reshape(x=output, shape=[b, heads, length, d], name=name, before_op=before_op)
    if length == 1:
        swapped = mb.transpose(
            x=output, perm=[0, 2, 1, 3], name=f"{name}_swap", before_op=before_op
        )
        return mb.reshape(x=swapped, shape=[b, heads, 1, d], name=name, before_op=before_op)
    split = mb.reshape(
        x=output, shape=[kv, g, length, d], name=f"{name}_split", before_op=before_op
    )
    swapped = mb.transpose(x=split, perm=[1, 0, 2, 3], name=f"{name}_swap", before_op=before_op)
    return mb.reshape(x=swapped, shape=[1, heads, length, d], name=name, before_op=before_op)


def remove_dead(block: Any, candidates: list[Any]) -> None:
    """Remove the replaced ops, and the constants only they read, once nothing reads them."""
    outputs = {id(var) for var in block.outputs}
    pending = list(candidates)
    removed: set[int] = set()
    while pending:
        op = pending.pop(0)
        if id(op) in removed or op.enclosing_block is not block:
            continue
        if any(var.child_ops or id(var) in outputs for var in op.outputs):
            continue
        parents = [
            parent.op
            for item in op.inputs.values()
            for parent in (item if isinstance(item, list | tuple) else [item])
            if parent.op is not None
        ]
        block.remove_ops([op])
        removed.add(id(op))
        pending += [
            parent for parent in parents if parent.op_type == "const" or parent in candidates
        ]
