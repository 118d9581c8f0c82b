"""Find the attention patterns that read replicated K/V, and decide whether folding them is exact.

A pattern is either a pair of matmuls, ``scores = Q @ K_rep^T`` and ``out = P @ V_rep`` with only
row-local ops in between, or one ``scaled_dot_product_attention`` op reading ``K_rep``/``V_rep``.

Folding ``[B, Hq, L, D]`` queries to ``[B, Hkv, G·L, D]`` is exact when every value between the
matmuls is computed row by row (one query head, one query position, all keys): elementwise ops,
``softmax`` and reductions over the key axis, and side inputs (masks, scales) that are the same
for every head. Anything else — an op reducing, transposing or reshaping across heads, a side
input that differs per head, a score tensor used outside the attention — makes the pattern
refused, with the reason.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from decodebench.formats.coreml.replication import Replication, Unproven, trace_replication

ELEMENTWISE_BINARY = frozenset(
    {"add", "sub", "mul", "real_div", "maximum", "minimum", "pow", "floor_div", "mod"}
)
ELEMENTWISE_UNARY = frozenset(
    {"exp", "exp2", "cast", "tanh", "sigmoid", "sqrt", "rsqrt", "abs", "log", "clip", "square"}
)
ROW_REDUCTIONS = frozenset(
    {"reduce_max", "reduce_min", "reduce_sum", "reduce_mean", "reduce_log_sum_exp"}
)
# Inputs of a region op that carry tensor data (the rest are constant parameters).
DATA_INPUTS: dict[str, tuple[str, ...]] = {"select": ("cond", "a", "b")}
# How far back from an output matmul the score matmul may be (the ops between are few).
MAX_REGION_DEPTH = 64


@dataclass
class Attention:
    """One attention reading replicated K and V, and what folding it requires."""

    kind: str  # "matmul" or "sdpa"
    anchor: Any  # the score matmul, or the sdpa op
    output_op: Any  # the output matmul, or the sdpa op
    query: Any
    key: Replication | Unproven | None
    value: Replication | Unproven | None
    region: list[Any] = field(default_factory=list)  # ops between the matmuls, program order
    side_inputs: dict[int, Any] = field(default_factory=dict)  # id -> var needing alignment
    reasons: list[str] = field(default_factory=list)

    @property
    def refused(self) -> bool:
        return bool(self.reasons)

    def refuse(self, reason: str) -> None:
        if reason not in self.reasons:
            self.reasons.append(reason)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """(batch, query heads, query length, head dim) of the query."""
        batch, heads, length, dim = (int(size) for size in self.query.shape)
        return batch, heads, length, dim


def _shape(var: Any) -> tuple[int, ...] | None:
    try:
        return tuple(int(size) for size in var.shape)
    except TypeError:
        return None


def _scalar(var: Any, default: Any = None) -> Any:
    if var is None or var.val is None:
        return default
    value = var.val
    return value.item() if hasattr(value, "item") else value


def find_attentions(block: Any) -> tuple[list[Attention], list[Any]]:
    """Attention patterns in ``block`` and the ops that replicate K/V outside any of them."""
    traced: dict[int, Replication | Unproven | None] = {}

    def replication_of(var: Any) -> Replication | Unproven | None:
        if id(var) not in traced:
            traced[id(var)] = trace_replication(var)
        return traced[id(var)]

    attentions: list[Attention] = []
    replicated_matmuls = [
        op
        for op in block.operations
        if op.op_type == "matmul" and replication_of(op.inputs["y"]) is not None
    ]
    paired: set[int] = set()
    for output_op in replicated_matmuls:
        score_op = _nearest_replicated_ancestor(output_op, {id(op) for op in replicated_matmuls})
        if score_op is None or id(score_op) in paired or id(output_op) in paired:
            continue
        paired.update({id(score_op), id(output_op)})
        attention = Attention(
            kind="matmul",
            anchor=score_op,
            output_op=output_op,
            query=score_op.inputs["x"],
            key=replication_of(score_op.inputs["y"]),
            value=replication_of(output_op.inputs["y"]),
        )
        _check_matmuls(attention)
        _walk_region(attention, block)
        attentions.append(attention)
    for op in block.operations:
        if op.op_type != "scaled_dot_product_attention":
            continue
        key, value = replication_of(op.inputs["key"]), replication_of(op.inputs["value"])
        if key is None and value is None:
            continue
        attention = Attention("sdpa", op, op, op.inputs["query"], key, value)
        attention.region = []
        mask = op.inputs.get("attn_mask")
        if mask is not None:
            _check_side_input(attention, op, mask)
        attentions.append(attention)
    for attention in attentions:
        _check_replications(attention)
    stray = [op for op in replicated_matmuls if id(op) not in paired]
    return attentions, stray


def _nearest_replicated_ancestor(output_op: Any, replicated: set[int]) -> Any | None:
    """Breadth-first up from the output matmul's ``x`` to the closest score matmul."""
    queue: deque[tuple[Any, int]] = deque([(output_op.inputs["x"], 0)])
    seen: set[int] = set()
    while queue:
        var, depth = queue.popleft()
        op = var.op
        if op is None or id(op) in seen or depth > MAX_REGION_DEPTH:
            continue
        seen.add(id(op))
        if id(op) in replicated:
            return op
        for item in op.inputs.values():
            for parent in item if isinstance(item, list | tuple) else [item]:
                queue.append((parent, depth + 1))
    return None


def _check_matmuls(attention: Attention) -> None:
    score, output = attention.anchor, attention.output_op
    for op in (score, output):
        if _scalar(op.inputs.get("transpose_x"), False):
            attention.refuse(f"matmul '{op.name}' transposes its left operand")
    query_shape = _shape(attention.query)
    if query_shape is None or len(query_shape) != 4:
        attention.refuse(f"the query of '{score.name}' is not a static rank-4 tensor")


def _check_replications(attention: Attention) -> None:
    key, value = attention.key, attention.value
    for role, replication in (("K", key), ("V", value)):
        if replication is None:
            attention.refuse(f"{role} is not replicated while the other is")
        elif isinstance(replication, Unproven):
            attention.refuse(f"{role} replication cannot be proven: {replication.reason}")
    if not (isinstance(key, Replication) and isinstance(value, Replication)):
        return
    if key.mapping != value.mapping or key.kv_heads != value.kv_heads:
        attention.refuse("K and V replicate their heads differently")
    query_shape = _shape(attention.query)
    if query_shape is not None and len(query_shape) == 4:
        if query_shape[1] != key.query_heads:
            attention.refuse(
                f"the query has {query_shape[1]} heads but K is replicated to {key.query_heads}"
            )
        if key.mapping.value == "h % Hkv" and query_shape[0] != 1 and query_shape[2] > 1:
            attention.refuse("the h % Hkv mapping with batch > 1 and several queries")
    if attention.kind == "sdpa" and (key.swapped or value.swapped):
        attention.refuse("K/V would need a transpose to feed scaled_dot_product_attention")


def _walk_region(attention: Attention, block: Any) -> None:
    """Every consumer of the scores, up to the output matmul, must work row by row."""
    score, output = attention.anchor, attention.output_op
    on_path: set[int] = {id(score.outputs[0])}
    region: dict[int, Any] = {}
    frontier = [score.outputs[0]]
    block_outputs = {id(var) for var in block.outputs}
    query_shape = _shape(attention.query)
    if query_shape is None or len(query_shape) != 4:
        return
    batch, heads, length = query_shape[:3]
    while frontier:
        var = frontier.pop()
        if id(var) in block_outputs:
            attention.refuse(f"'{var.name}' (per-head scores) is an output of the program")
        for consumer in var.child_ops:
            if consumer is output and output.inputs["x"] is var:
                continue
            if id(consumer) in region:
                continue
            reason = _row_local_reason(consumer, (batch, heads, length))
            if reason:
                attention.refuse(reason)
                continue
            region[id(consumer)] = consumer
            for produced in consumer.outputs:
                on_path.add(id(produced))
                frontier.append(produced)
    order = {id(op): index for index, op in enumerate(block.operations)}
    attention.region = sorted(region.values(), key=lambda op: order[id(op)])
    for op in attention.region:
        for name in DATA_INPUTS.get(op.op_type, ("x", "y")):
            var = op.inputs.get(name)
            if var is not None and id(var) not in on_path:
                _check_side_input(attention, op, var)


def _row_local_reason(op: Any, prefix: tuple[int, int, int]) -> str | None:
    """None when ``op`` keeps rows independent; otherwise why it does not."""
    out_shape = _shape(op.outputs[0]) if len(op.outputs) == 1 else None
    keeps_rows = out_shape is not None and len(out_shape) == 4 and out_shape[:3] == prefix
    name = f"{op.op_type} '{op.name}'"
    if op.op_type == "softmax":
        axis = _scalar(op.inputs.get("axis"), -1)
        if axis not in (-1, 3):
            across = "heads" if axis in (1, -3) else f"axis {axis}"
            return f"{name} between the matmuls normalises across {across}, not keys"
    elif op.op_type in ROW_REDUCTIONS:
        axes = op.inputs.get("axes")
        axes_value = [] if axes is None or axes.val is None else [int(a) for a in axes.val]
        if sorted(a % 4 for a in axes_value) != [3]:
            mixes = (
                " (mixes heads)" if any(a % 4 == 1 for a in axes_value) or not axes_value else ""
            )
            return f"{name} between the matmuls reduces over axes {axes_value or 'all'}{mixes}"
        if not _scalar(op.inputs.get("keep_dims"), False):
            return f"{name} between the matmuls drops the key axis"
    elif op.op_type not in ELEMENTWISE_BINARY | ELEMENTWISE_UNARY | {"select"}:
        detail = (
            "moves or mixes heads" if op.op_type in ("transpose", "reshape") else "may mix heads"
        )
        return f"{name} between the matmuls is not row-local ({detail})"
    if not keeps_rows:
        return f"{name} between the matmuls changes the [batch, heads, queries] axes"
    return None


def _check_side_input(attention: Attention, op: Any, var: Any) -> None:
    """A mask or scale entering between the matmuls must be the same for every head."""
    shape = _shape(var)
    if shape is None:
        attention.refuse(f"input '{var.name}' of '{op.name}' has a dynamic shape")
        return
    if len(shape) > 4:
        attention.refuse(f"input '{var.name}' of '{op.name}' has rank {len(shape)}")
        return
    padded = (1,) * (4 - len(shape)) + shape
    if padded[1] != 1:
        attention.refuse(f"input '{var.name}' of '{op.name}' differs per head ({list(shape)})")
        return
    query_shape = _shape(attention.query)
    if query_shape is not None and len(query_shape) == 4 and padded[2] == query_shape[2] > 1:
        attention.side_inputs[id(var)] = var
