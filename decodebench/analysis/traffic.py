"""What one decoded token moves through memory, read off one function of a MIL program.

Four categories, each from the tensor shapes and dtypes the program declares:

- **weights**: every stored weight at its stored width, as the constexpr ops lay it out (int4 /
  int8 data plus scales and offsets for ``constexpr_blockwise_shift_scale``, indices plus the
  lookup table for ``constexpr_lut_to_dense``, ...). A weight only ever gathered (an untied
  embedding, the RoPE tables) is read for the rows gathered, not whole.
- **KV cache**: every state the function reads, once, at full context: the attention matmuls
  have static shapes, so they read all ``context`` positions whatever the decode position. What a
  position-aware kernel would read (positions ``0..p``) is reported per position.
- **KV written**: the bytes that state writes change (the ``slice_update`` update, not the
  whole state), plus KV-named outputs for a cache the host updates.
- **redundant**: tensors that are pure copies of another tensor, found by
  :mod:`decodebench.analysis.copies`. Each is written once and read again, so it costs twice its size.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from decodebench.analysis.graph import Constant, Graph, Op, Tensor
from decodebench.contracts.analysis import KvState

# Inline (immediate) tensors at least this big are weights stored in the program itself;
# smaller ones are shapes, axes and scalars (unless a constexpr op decompresses them).
LARGE_IMMEDIATE_BYTES = 1024
STATE_WRITE_OPS = frozenset({"coreml_update_state", "write_state"})
# Ops that relabel a tensor without moving it (followed back to find where a copy came from).
VIEW_OPS = frozenset({"reshape", "reshape_like", "expand_dims", "squeeze", "identity", "cast"})
# Applied to a constant they are folded when the model loads, so the weight is read as stored.
WEIGHT_VIEW_OPS = VIEW_OPS | {"transpose"}
GATHER_OPS = frozenset({"gather", "gather_along_axis", "gather_nd"})
KV_NAME = re.compile(r"key|value|past|present|cache|(^|[._])(k|v|kv)([._\d]|$)", re.IGNORECASE)


def is_constant_op(operation: Op) -> bool:
    return operation.type == "const" or operation.type.startswith("constexpr_")


@dataclass(frozen=True)
class StoredWeight:
    key: tuple[str, ...]
    bytes: int
    dtype: str
    encoding: str
    holder: Constant


@dataclass(frozen=True)
class KvTraffic:
    source: str  # states | inputs | none
    states: list[KvState]
    read_bytes: int
    write_bytes: int
    state_write_ops: int
    state_write_bytes: int


# --- weights ---------------------------------------------------------------------------------


def _decompressed_by(graph: Graph, operation: Op) -> str | None:
    for output in operation.outputs:
        for consumer, _ in graph.consumers.get(output, []):
            if consumer.type.startswith("constexpr_"):
                return consumer.type
    return None


def stored_weights(graph: Graph) -> list[StoredWeight]:
    """Every constant of the function that is stored weight data (blob or large immediate)."""
    weights = []
    for held in graph.constants:
        operation, tensor = held.op, held.tensor
        rank = len(tensor.shape or ())
        compressed_by = (
            operation.type
            if operation.type.startswith("constexpr_")
            else (_decompressed_by(graph, operation) if operation.type == "const" else None)
        )
        if held.stored_at is not None:
            key: tuple[str, ...] = ("blob", *held.stored_at)
        elif tensor.bytes >= LARGE_IMMEDIATE_BYTES or (compressed_by is not None and rank >= 1):
            key = ("immediate", graph.name, operation.name, held.parameter)
        else:
            continue
        weights.append(
            StoredWeight(key, tensor.bytes, tensor.dtype, compressed_by or "dense", held)
        )
    return weights


def _read_fraction_of_values(graph: Graph, names: list[str], depth: int = 0) -> float:
    """Share of a constant one call reads: 1 if any op uses it whole, else the rows gathered."""
    gathered = 0.0
    for name in names:
        elements = graph.elements_of(name)
        for consumer, parameter in graph.consumers.get(name, []):
            if consumer.type.startswith("constexpr_") or consumer.type in WEIGHT_VIEW_OPS:
                outputs = list(consumer.outputs)
                share = _read_fraction_of_values(graph, outputs, depth + 1) if depth < 16 else 1
                if share >= 1.0:
                    return 1.0
                gathered += share
            elif consumer.type in GATHER_OPS and parameter == "x" and elements:
                rows = graph.elements_of(consumer.outputs[0]) if consumer.outputs else None
                gathered += (rows or elements) / elements
            else:
                return 1.0
    return min(1.0, gathered)


def weight_read_fraction(graph: Graph, weight: StoredWeight) -> float:
    operation = weight.holder.op
    if is_constant_op(operation):
        return _read_fraction_of_values(graph, list(operation.outputs))
    return 1.0  # bound inline to a compute op, which reads it whole


def weight_bytes_read(graph: Graph) -> int:
    """Weight bytes one call of ``graph`` reads (a blob shared by several consts, once)."""
    shares: dict[tuple[str, ...], tuple[int, float]] = {}
    for weight in stored_weights(graph):
        fraction = weight_read_fraction(graph, weight)
        _, previous = shares.get(weight.key, (0, 0.0))
        shares[weight.key] = (weight.bytes, max(previous, fraction))
    return round(sum(size * fraction for size, fraction in shares.values()))


# --- KV cache --------------------------------------------------------------------------------


def through_views(graph: Graph, name: str | None) -> tuple[Op | None, str | None]:
    """The first producer of ``name`` that is not a view, and the value it produced."""
    for _ in range(64):
        producer = graph.producers.get(name) if name else None
        if producer is None or producer.type not in VIEW_OPS:
            return producer, name
        name = graph.argument_name(producer, "x")
    return None, name


def _state_read(graph: Graph, name: str | None) -> str | None:
    producer, _ = through_views(graph, name)
    if producer is not None and producer.type == "read_state":
        return graph.argument_name(producer, "input")
    return None


def _sequence_axes(graph: Graph) -> dict[str, int]:
    """The position axis of each state: where a ``slice_update`` writes fewer entries."""
    axes: dict[str, int] = {}
    for operation in graph.operations:
        if operation.type != "slice_update":
            continue
        state = _state_read(graph, graph.argument_name(operation, "x"))
        whole = graph.shape_of(graph.argument_name(operation, "x"))
        update = graph.shape_of(graph.argument_name(operation, "update"))
        if state is None or whole is None or update is None or len(whole) != len(update):
            continue
        narrower = [axis for axis, (a, b) in enumerate(zip(whole, update, strict=True)) if b < a]
        if len(narrower) == 1:
            axes.setdefault(state, narrower[0])
    return axes


def _kv_state(name: str, tensor: Tensor, axis: int | None, read: bool) -> KvState:
    shape = list(tensor.shape or ())
    size = tensor.bytes
    if axis is None and shape:
        axis = max(range(len(shape)), key=lambda index: shape[index])
    positions = shape[axis] if axis is not None and shape else 0
    return KvState(
        name=name,
        shape=shape,
        dtype=tensor.dtype,
        bytes=size,
        positions=positions,
        bytes_per_position=size // positions if positions else 0,
        read=read,
    )


def written_bytes(graph: Graph, operation: Op) -> int:
    """Bytes a state write really changes: the slice when the value is a slice_update."""
    name = graph.argument_name(operation, "data" if operation.type == "write_state" else "value")
    producer = graph.producers.get(name) if name else None
    while producer is not None and producer.type == "cast":
        producer = graph.producers.get(graph.argument_name(producer, "x") or "")
    if producer is not None and producer.type == "slice_update":
        return graph.bytes_of(graph.argument_name(producer, "update"))
    return graph.bytes_of(name)


def _looks_like_kv(graph: Graph, name: str) -> bool:
    shape = graph.shape_of(name)
    return bool(KV_NAME.search(name)) and shape is not None and len(shape) >= 3


def kv_traffic(graph: Graph) -> KvTraffic:
    read_states = {
        graph.argument_name(operation, "input")
        for operation in graph.operations
        if operation.type == "read_state"
    }
    axes = _sequence_axes(graph)
    states = [
        _kv_state(name, tensor, axes.get(name), name in read_states)
        for name, tensor in graph.states.items()
    ]
    source = "states" if states else "none"
    if not states:
        # A stateless decoder gets its cache as inputs (and returns the new entries).
        states = [
            _kv_state(name, tensor, None, True)
            for name, tensor in graph.inputs.items()
            if _looks_like_kv(graph, name)
        ]
        source = "inputs" if states else "none"
    writes = [op for op in graph.operations if op.type in STATE_WRITE_OPS]
    state_write_bytes = sum(written_bytes(graph, operation) for operation in writes)
    output_bytes = sum(
        graph.bytes_of(name) for name in graph.outputs if _looks_like_kv(graph, name)
    )
    return KvTraffic(
        source=source,
        states=states,
        read_bytes=sum(state.bytes for state in states if state.read),
        write_bytes=state_write_bytes + output_bytes,
        state_write_ops=len(writes),
        state_write_bytes=state_write_bytes,
    )


def dispatch_ops(graph: Graph) -> int:
    """Ops a call runs: constants and constexpr decompression happen once, at load."""
    return sum(not is_constant_op(operation) for operation in graph.operations)
