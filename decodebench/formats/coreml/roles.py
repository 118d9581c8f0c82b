"""What each input of a decode step does, read from the program's dataflow, not its names.

- the **token** is an integer that indexes a ``gather`` on a vocabulary-sized table (the
  embedding: as many rows along the gathered axis as the logits have entries);
- the **position** is an integer that indexes the KV-cache write (``slice_update`` begin/end,
  a ``scatter``), a ``gather`` on another table (RoPE), or builds the mask that is added to the
  attention scores;
- the **mask** is a tensor added to (or multiplied with, or selecting) the attention scores, the
  output of a ``matmul``, or a ``scaled_dot_product_attention`` mask.

An integer is followed through integer- and bool-valued ops only (casts, reshapes, the
negative-index guards, the ``concat`` that builds a slice's begin): an integer that is turned
into floats is followed on as a float only to see whether it reaches the scores. A mask is
followed through shape, cast and elementwise ops. :func:`infer_roles` returns, per input, the
roles its dataflow shows and why; :mod:`decodebench.formats.coreml.inputs` decides from them, and asks for a
mapping file only when two inputs show the same role.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from coremltools.converters.mil.mil import types

GATHERS = frozenset({"gather", "gather_nd", "gather_along_axis"})
CACHE_WRITES = frozenset(
    {"slice_update", "scatter", "scatter_nd", "scatter_along_axis", "coreml_update_state"}
)
# Ops a mask (or a float made from the position) passes through before meeting the scores.
MASK_PATH = frozenset(
    {
        "cast",
        "reshape",
        "expand_dims",
        "squeeze",
        "transpose",
        "tile",
        "slice_by_index",
        "slice_by_size",
        "mul",
        "sub",
        "add",
        "real_div",
        "select",
        "identity",
        "concat",
    }
)
# Ops between a score matmul and the add of the mask (the 1/sqrt(d) scale, dtype casts).
SCORE_PATH = frozenset(
    {"mul", "real_div", "cast", "reshape", "transpose", "expand_dims", "squeeze", "add"}
)
MAX_HOPS = 12


@dataclass
class Evidence:
    token: list[str] = field(default_factory=list)
    position: list[str] = field(default_factory=list)
    mask: list[str] = field(default_factory=list)
    # What only a position does: index the KV-cache write, or build the mask.
    position_only: bool = False

    def roles(self) -> set[str]:
        return {role for role in ("token", "position", "mask") if getattr(self, role)}


def _is_integer(var: Any) -> bool:
    dtype = getattr(var, "dtype", None)
    return dtype is not None and (types.is_int(dtype) or dtype == types.bool)


def _uses(var: Any) -> Iterator[tuple[Any, str]]:
    """(op, argument name) for every op reading ``var``, tuple arguments included."""
    for op in var.child_ops:
        for name, value in op.inputs.items():
            values = value if isinstance(value, (list, tuple)) else (value,)
            if any(item is var for item in values):
                yield op, name


def _table_rows(op: Any) -> int | None:
    table = op.inputs.get("x")
    shape = getattr(table, "shape", None)
    if shape is None:
        return None
    axis = op.inputs["axis"].val if "axis" in op.inputs and op.op_type != "gather_nd" else 0
    axis = int(axis) + (len(shape) if int(axis) < 0 else 0)
    rows = shape[axis] if 0 <= axis < len(shape) else None
    return rows if isinstance(rows, int) else None


def _is_scores(var: Any, depth: int = 4) -> bool:
    """Does ``var`` come from a matmul of two computed tensors (attention scores)?"""
    op = var.op
    if op is None or depth < 0:
        return False
    if op.op_type == "matmul":
        return all(getattr(arg, "op", None) is None or arg.op.op_type != "const"
                   for arg in (op.inputs["x"], op.inputs["y"]))  # fmt: skip
    if op.op_type not in SCORE_PATH:
        return False
    return any(
        _is_scores(arg, depth - 1)
        for name, arg in op.inputs.items()
        if name in ("x", "y") and getattr(arg, "op", None) is not None
    )


def _meets_scores(start: Any, hops: int = MAX_HOPS) -> str | None:
    """Where a float flow from ``start`` meets the attention scores, or None."""
    frontier, seen = [start], {id(start)}
    for _ in range(hops):
        following = []
        for var in frontier:
            for op, argument in _uses(var):
                if op.op_type == "scaled_dot_product_attention" and argument == "attn_mask":
                    return f"the attn_mask of {op.name}"
                if op.op_type in ("add", "mul", "select"):
                    others = [v for n, v in op.inputs.items() if n in ("x", "y", "a", "b")
                              and v is not var]  # fmt: skip
                    if any(_is_scores(other) for other in others):
                        return f"{op.op_type} {op.name} with the attention scores"
                if op.op_type in MASK_PATH:
                    for out in op.outputs:
                        if id(out) not in seen:
                            seen.add(id(out))
                            following.append(out)
        frontier = following
    return None


def _follow_integer(start: Any, vocab: int, evidence: Evidence, is_mask: bool) -> None:
    """``is_mask``: ``start`` is a whole row of keys (an integer or bool mask), so reaching the
    scores makes it the mask, not the position."""
    frontier, seen = [start], {id(start)}
    for _ in range(MAX_HOPS):
        following = []
        for var in frontier:
            for op, argument in _uses(var):
                if op.op_type in GATHERS and argument == "indices":
                    rows = _table_rows(op)
                    if rows == vocab:
                        evidence.token.append(f"indexes {op.name}, a {rows}-row table")
                    else:
                        evidence.position.append(f"indexes {op.name}, a {rows}-row table")
                    continue
                if op.op_type in CACHE_WRITES and argument != "x":
                    evidence.position.append(f"indexes the cache write {op.name}")
                    evidence.position_only = True
                    continue
                for out in op.outputs:
                    if id(out) in seen:
                        continue
                    seen.add(id(out))
                    if _is_integer(out):
                        following.append(out)
                    elif (where := _meets_scores(out)) is not None:
                        if is_mask:
                            evidence.mask.append(f"reaches {where}")
                        else:
                            evidence.position.append(f"builds the mask: {where}")
                            evidence.position_only = True
        frontier = following


def infer_roles(function: Any, vocab: int, context: int) -> dict[str, Evidence]:
    """Per input of ``function`` (a pymil Function): the roles its dataflow shows, and why."""
    found: dict[str, Evidence] = defaultdict(Evidence)
    for name, var in function.inputs.items():
        if types.is_state(var.sym_type):
            continue
        evidence = found[name]
        shape = tuple(getattr(var, "shape", ()) or ())
        is_mask = len(shape) > 0 and shape[-1] == context and math.prod(shape) > 1
        if _is_integer(var):
            _follow_integer(var, vocab, evidence, is_mask)
        if evidence.token and evidence.position_only:
            # It writes the cache or builds the mask, so a vocabulary-sized table it indexes is a
            # position table (RoPE) that happens to have as many rows as the vocabulary.
            evidence.position += [f"{why} (a position table)" for why in evidence.token]
            evidence.token.clear()
        if not evidence.roles():
            where = _meets_scores(var)
            if where is not None:
                evidence.mask.append(f"reaches {where}")
    return dict(found)
