"""Name every op of a decoder program by layer and role, from the dataflow (not from op names).

The landmarks are the normalisations (:mod:`decodebench.formats.coreml.norms`) and the attention score
products (a ``matmul`` of two computed tensors whose result reaches a ``softmax``):

- a norm whose output reaches the next score product is that layer's **input norm**; the layers
  are numbered by their input norms, in program order, and a layer runs from its input norm to
  the next one;
- a norm between a layer's scores and the next input norm is its **post-attention norm**; a norm
  after the last layer is the **final norm** (part of the head);
- the score product is **attention scores**, ops between it and the output product are the
  **softmax** (its ``reduce_sum`` the **softmax sum**), a projection (``linear``, or ``matmul``
  with a constant weight) after the post-attention norm reading a product of two computed
  tensors is the **MLP down-projection**, an ``add`` of two computed hidden states the
  **residual add**, and the op making the logits output **logits**.

Labels read like ``layer 2 · input norm · square``; ops before the first layer are the
``embedding``'s, ops after the last the ``head``'s.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from decodebench.formats.coreml.norms import Norm, find_norms

REACH_HOPS = 24


@dataclass(frozen=True)
class Place:
    layer: int | None  # None: the embedding (before layer 0) or the head (after the last layer)
    section: str  # "layer", "embedding" or "head"
    role: str

    @property
    def label(self) -> str:
        where = f"layer {self.layer}" if self.layer is not None else self.section
        return f"{where} · {self.role}"


def _is_computed(var: Any) -> bool:
    """Not a constant (a function input or another op's output)."""
    producer = var.op.op_type if var.op is not None else ""
    return producer != "const" and not producer.startswith("constexpr_")


def _reaches(start: Any, targets: set[int], hops: int = REACH_HOPS) -> bool:
    queue: deque[tuple[Any, int]] = deque([(start, 0)])
    seen: set[int] = set()
    while queue:
        var, depth = queue.popleft()
        for op in var.child_ops:
            if id(op) in targets:
                return True
            if id(op) in seen or depth >= hops:
                continue
            seen.add(id(op))
            for out in op.outputs:
                queue.append((out, depth + 1))
    return False


def _score_products(function: Any) -> tuple[list[Any], dict[int, str]]:
    """The score matmuls (and sdpa ops) in program order, and the roles of the ops after them."""
    scores: list[Any] = []
    roles: dict[int, str] = {}
    softmaxes = {id(op) for op in function.operations if op.op_type == "softmax"}
    for op in function.operations:
        if op.op_type == "scaled_dot_product_attention":
            scores.append(op)
            roles[id(op)] = "attention"
        elif op.op_type == "matmul" and all(_is_computed(op.inputs[name]) for name in ("x", "y")):
            if _reaches(op.outputs[0], softmaxes, hops=8):
                scores.append(op)
                roles[id(op)] = "attention scores"
                _name_softmax_region(op, roles)
    return scores, roles


def _name_softmax_region(score: Any, roles: dict[int, str]) -> None:
    frontier, seen = [score.outputs[0]], set()
    for _ in range(12):
        following = []
        for var in frontier:
            for op in var.child_ops:
                if id(op) in seen:
                    continue
                seen.add(id(op))
                if op.op_type == "matmul":
                    roles.setdefault(id(op), "attention output")
                    continue
                role = {
                    "softmax": "softmax",
                    "reduce_sum": "softmax sum",
                    "exp": "softmax exp",
                    "reduce_max": "softmax max",
                }.get(op.op_type, f"scores {op.op_type}")
                roles.setdefault(id(op), role)
                following += list(op.outputs)
        frontier = following


def _is_projection(op: Any) -> bool:
    if op.op_type == "linear":
        return True
    return op.op_type == "matmul" and not _is_computed(op.inputs["y"])


def _norm_roles(
    norms: list[Norm], order: dict[int, int], score_order: list[int], score_ids: set[int]
) -> tuple[list[Norm], dict[int, str]]:
    """The input norms (one per layer, in order), and id(norm) -> its role."""
    input_norms: list[Norm] = []
    norm_role: dict[int, str] = {}
    for position, norm in enumerate(norms):
        start = order[id(norm.square)]
        following = [index for index in score_order if index > start]
        later = norms[position + 1] if position + 1 < len(norms) else None
        # The last norm before a score product, feeding it, is that layer's input norm.
        last_before = later is None or not following or order[id(later.square)] > following[0]
        if following and last_before and _reaches(norm.output, score_ids, REACH_HOPS):
            input_norms.append(norm)
            norm_role[id(norm)] = "input norm"
        elif following or (score_order and later is not None):
            norm_role[id(norm)] = "post-attention norm"
        else:
            norm_role[id(norm)] = "final norm" if score_order else "norm"
    return input_norms, norm_role


def _projection_role(op: Any, where: str, after_post_norm: bool, after_scores: bool) -> str:
    """A projection's role from where it sits: the head's, the MLP's (down if it reads a
    product of two computed tensors) or attention's (output, after the layer's scores)."""
    reads = op.inputs["x"]
    product = (
        reads.op is not None
        and reads.op.op_type == "mul"
        and all(_is_computed(reads.op.inputs[name]) for name in ("x", "y"))
    )
    if where == "head":
        return "lm_head"
    if after_post_norm and product:
        return "MLP down-projection"
    if after_post_norm:
        return "MLP up/gate projection"
    if after_scores:
        return "attention output projection"
    return "attention projection"


def places(function: Any) -> dict[int, Place]:
    """id(op) -> where it sits, for every op of ``function`` (a pymil Function)."""
    operations = list(function.operations)
    order = {id(op): index for index, op in enumerate(operations)}
    norms = find_norms(function)
    scores, attention_roles = _score_products(function)
    score_ids = {id(op) for op in scores}
    score_order = [order[id(op)] for op in scores]

    input_norms, norm_role = _norm_roles(norms, order, score_order, score_ids)
    starts = [order[id(norm.ops()[0])] for norm in input_norms]
    last_score = max(score_order) if score_order else -1
    head_start = min(
        (order[id(norm.ops()[0])] for norm in norms if norm_role[id(norm)] == "final norm"),
        default=len(operations),
    )

    def section(index: int) -> tuple[int | None, str]:
        if not starts or index < starts[0]:
            return None, "embedding"
        if index >= head_start and index > last_score:
            return None, "head"
        layer = sum(1 for start in starts if start <= index) - 1
        return layer, "layer"

    part_of: dict[int, str] = {}
    for norm in norms:
        for op_id, part in norm.parts().items():
            part_of[op_id] = f"{norm_role[id(norm)]} · {part}"
    outputs = {id(var) for var in function.outputs}
    hidden_shape = tuple(input_norms[0].source.shape) if input_norms else None
    post_norm_seen: dict[int | None, bool] = {}
    found: dict[int, Place] = {}
    for index, op in enumerate(operations):
        layer, where = section(index)
        if op.op_type == "const":
            continue
        role = part_of.get(id(op)) or attention_roles.get(id(op))
        if role and role.startswith("post-attention norm"):
            post_norm_seen[layer] = True
        if role is None:
            if any(id(var) in outputs for var in op.outputs) and where == "head":
                role = "logits"
            elif _is_projection(op):
                after_scores = any(s < index and section(s)[0] == layer for s in score_order)
                role = _projection_role(op, where, bool(post_norm_seen.get(layer)), after_scores)
            elif (
                op.op_type == "add"
                and hidden_shape is not None
                and all(_is_computed(op.inputs[name]) for name in ("x", "y"))
                and tuple(op.outputs[0].shape) == hidden_shape
            ):
                role = "residual add"
            else:
                role = op.op_type
        found[id(op)] = Place(layer=layer, section=where, role=role)
    return found


def describe(function: Any) -> dict[str, Place]:
    """op name -> place, for every non-const op."""
    by_id = places(function)
    return {op.name: by_id[id(op)] for op in function.operations if id(op) in by_id}


def dimensions(function: Any, found: dict[str, Place]) -> tuple[int | None, int | None]:
    """(layers, hidden width) of a decoder as its anatomy shows them: how many layers were
    numbered, and the last axis of what its norms normalise (None where none is found)."""
    layers = {place.layer for place in found.values() if place.layer is not None}
    norms = find_norms(function)
    width = None
    if norms:
        shape = norms[0].source.shape
        width = int(shape[-1]) if shape and isinstance(shape[-1], int | np.integer) else None
    return (max(layers) + 1 if layers else None), width
