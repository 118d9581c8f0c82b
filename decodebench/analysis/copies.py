"""Redundant copies: tensors that only copy another one, so a token writes and re-reads them.

Five kinds, from the shapes and constants of the program:

- ``tile``: always a copy (``expand`` + ``reshape`` of a stride-0 view converts to it);
- ``broadcast_in_dims``: Core AI's form of the same replication, when it makes floating-point
  data bigger (an integer index broadcast is address arithmetic, not a copy of data);
- ``repeat_concat``: a ``concat`` of one tensor with itself (``cat([k] * G)``), views skipped;
- ``repeat_gather``: a ``gather`` of an activation with repeated constant indices that makes
  it bigger;
- ``broadcast``: an identity op (``x + 0``, ``x * 1``, ``x - 0``, ``x / 1``) whose output is
  bigger than ``x``, i.e. a materialised broadcast;
- ``transpose``: a transpose of at least ``LARGE_TRANSPOSE_BYTES`` that really reorders memory
  (one that only moves size-1 axes is a relabelling and is not counted).

Each is listed with the op and tensor that make it and where the copied data comes from (the
producer of its input, views skipped: for the replicated KV cache, ``read_state`` of the state).
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from decodebench.analysis.graph import Graph, Op
from decodebench.analysis.traffic import GATHER_OPS, is_constant_op, through_views
from decodebench.contracts.analysis import RedundantCopy

# A transpose smaller than this stays in on-chip memory; a larger one makes a round trip to DRAM.
LARGE_TRANSPOSE_BYTES = 1 << 20
# op -> (the parameters that may hold the identity element, the identity element)
IDENTITY_OPERANDS: dict[str, tuple[tuple[str, ...], float]] = {
    "add": (("x", "y"), 0.0),
    "sub": (("y",), 0.0),
    "mul": (("x", "y"), 1.0),
    "real_div": (("y",), 1.0),
}


def copy_source(graph: Graph, name: str | None) -> tuple[str, str]:
    """Where a copied tensor comes from: (op type, value or state name), views skipped."""
    if name is None:
        return "none", ""
    producer, value = through_views(graph, name)
    if producer is None:
        return ("input", value or "") if value in graph.inputs else ("none", value or "")
    if producer.type == "read_state":
        return "read_state", graph.argument_name(producer, "input") or value or ""
    return producer.type, value or ""


def _is_constant(graph: Graph, name: str) -> bool:
    producer, _ = through_views(graph, name)
    return producer is not None and is_constant_op(producer)


def _repeats_its_input(graph: Graph, operation: Op) -> str | None:
    """The repeated input of a concat or gather that only replicates it, else None."""
    if operation.type == "concat":
        roots = [
            through_views(graph, name)[1]
            for name in graph.argument_names(operation, "values")
            if not _is_constant(graph, name)
        ]
        repeated = [root for root, count in Counter(roots).items() if root and count > 1]
        return repeated[0] if repeated else None
    if operation.type in GATHER_OPS:
        data = graph.argument_name(operation, "x")
        indices = graph.constant(operation, "indices")
        if data is None or _is_constant(graph, data) or indices is None or not operation.outputs:
            return None
        gathered = graph.elements_of(operation.outputs[0]) or 0
        has_duplicates = np.unique(indices).size < indices.size
        return data if has_duplicates and gathered > (graph.elements_of(data) or 0) else None
    return None


def _broadcast_input(graph: Graph, operation: Op) -> str | None:
    """The input an identity op (x + 0, x * 1, ...) only broadcasts to a bigger shape."""
    if operation.type not in IDENTITY_OPERANDS or not operation.outputs:
        return None
    parameters, identity = IDENTITY_OPERANDS[operation.type]
    produced = graph.elements_of(operation.outputs[0]) or 0
    for parameter in parameters:
        constant = graph.constant(operation, parameter)
        if constant is None or constant.size == 0 or not np.all(constant == identity):
            continue
        other = graph.argument_name(operation, "y" if parameter == "x" else "x")
        if other is not None and produced > (graph.elements_of(other) or produced):
            return other
    return None


def _moves_data(shape: list[int], permutation: np.ndarray) -> bool:
    """False when the permutation only moves size-1 axes (the memory order is unchanged)."""
    order = [int(axis) for axis in permutation.reshape(-1) if shape[int(axis)] != 1]
    return order != sorted(order)


def is_replication(graph: Graph, operation: Op) -> bool:
    """A ``tile``, or a ``broadcast_in_dims`` that makes floating-point data bigger: the op
    that replicates the KV heads under ``repeat_kv`` in Core ML and in Core AI."""
    if operation.type == "tile":
        return True
    if operation.type != "broadcast_in_dims" or not operation.outputs:
        return False
    data = graph.argument_name(operation, "x")
    made = graph.elements_of(operation.outputs[0]) or 0
    return graph.tensor(data).dtype.startswith(("float", "bfloat")) and made > (
        graph.elements_of(data) or made
    )


def _copied_input(graph: Graph, operation: Op) -> tuple[str, str | None] | None:
    """(kind, copied input) when ``operation`` is a pure copy, else None."""
    if is_replication(graph, operation):
        return operation.type, graph.argument_name(operation, "x")
    if operation.type == "concat":
        repeated = _repeats_its_input(graph, operation)
        return ("repeat_concat", repeated) if repeated else None
    if operation.type in GATHER_OPS:
        repeated = _repeats_its_input(graph, operation)
        return ("repeat_gather", repeated) if repeated else None
    if operation.type in IDENTITY_OPERANDS:
        broadcast = _broadcast_input(graph, operation)
        return ("broadcast", broadcast) if broadcast else None
    if operation.type == "transpose" and operation.outputs:
        data = graph.argument_name(operation, "x")
        shape, permutation = graph.shape_of(data), graph.constant(operation, "perm")
        large = graph.bytes_of(operation.outputs[0]) >= LARGE_TRANSPOSE_BYTES
        # A transposed weight is laid out once, when the program is compiled for the device.
        if data is not None and _is_constant(graph, data):
            return None
        if large and shape is not None and permutation is not None:
            if len(shape) == permutation.size and _moves_data(shape, permutation):
                return "transpose", data
    return None


def redundant_copies(graph: Graph) -> list[RedundantCopy]:
    copies = []
    for operation in graph.operations:
        found = _copied_input(graph, operation)
        if found is None:
            continue
        kind, copied = found
        source_op, source = copy_source(graph, copied)
        for output in operation.outputs:
            tensor = graph.tensor(output)
            copies.append(
                RedundantCopy(
                    kind=kind,
                    op=operation.type,
                    name=output,
                    function=graph.name,
                    shape=list(tensor.shape or ()),
                    dtype=tensor.dtype,
                    bytes=tensor.bytes,
                    moved_bytes=2 * tensor.bytes,
                    source_op=source_op,
                    source=source,
                )
            )
    return copies
