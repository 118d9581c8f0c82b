"""A Core AI asset as the neutral graph the analyses read (:mod:`decodebench.analysis.graph`).

Core AI passes every parameter as an operand; each kind's operands are named here as the
analyses name them (``x`` the data, ``perm`` a transpose's order, ``indices`` a gather's,
``values`` what a concat joins), and ``coreai.constant`` is a ``const`` whose numbers are read
on demand. A weight stored as a resource blob is keyed by its blob, so one blob read by two
ops counts once.

coreai-opt's compressed weights read as Core ML's: a ``blockwise_shift_scale`` or
``lut_to_dense`` of constants only expands a stored weight once, when the program loads, so it
is read as ``constexpr_blockwise_shift_scale`` / ``constexpr_lut_to_dense`` and its weight is
counted at its stored width (int4 data, fp16 scales). A splat constant (the zero offsets) is
stored as one value and counted so.
"""

from __future__ import annotations

from pathlib import Path

from decodebench.analysis.graph import Constant, Graph, Op, ProgramGraph, Tensor
from decodebench.formats.coreai.kernels import KERNELS
from decodebench.formats.coreai.program import Function, ValueType, load_program

DECODE_FUNCTION = "main"
# Operand names by kind (the rest: x, y, then operand_<n>).
PARAMETERS: dict[str, tuple[str, ...]] = {
    "reshape": ("x", "shape"),
    "transpose": ("x", "perm"),
    "broadcast_in_dims": ("x", "shape", "axes"),
    "broadcast_to": ("x", "shape"),
    "gather_nd": ("x", "indices"),
    "gather_along_axis": ("x", "indices", "axis"),
    "gather": ("x", "indices", "axis"),
    "slice": ("x", "begin", "end", "stride"),
    "softmax": ("x", "axis"),
    "cast": ("x",),
    "blockwise_shift_scale": ("data", "scale", "offset", "offset2"),
    "lut_to_dense": ("indices", "lut", "axis"),
}
# Core AI's decompression kinds -> the neutral graph's load-time (constexpr) op types.
DECOMPRESSION = {
    "blockwise_shift_scale": "constexpr_blockwise_shift_scale",
    "lut_to_dense": "constexpr_lut_to_dense",
}
REDUCTIONS = ("reduce_max", "reduce_min", "reduce_sum", "reduce_mean", "reduce_product")
KNOWN_OPS = frozenset({"const", *KERNELS, *DECOMPRESSION.values()})


def _tensor(value_type: ValueType, state: bool = False) -> Tensor:
    return Tensor(shape=value_type.shape, dtype=value_type.dtype, bits=value_type.bits, state=state)


def _inputs(kind: str, operands: list[str]) -> dict[str, list[str]]:
    if kind == "concat":
        return {"axis": operands[:1], "values": operands[1:]}
    names = PARAMETERS.get(kind.removeprefix("constexpr_"))
    if names is None:
        names = ("x", "axes") if kind in REDUCTIONS else ("x", "y", "z")
    bound: dict[str, list[str]] = {}
    for index, key in enumerate(operands):
        name = names[index] if index < len(names) else f"operand_{index}"
        bound[name] = [key]
    return bound


def function_graph(function: Function) -> Graph:
    graph = Graph(
        name=function.name,
        opset="coreai",
        inputs={
            function.inputs[name]: _tensor(kind) for name, kind in function.input_types.items()
        },
        outputs=list(function.outputs.values()),
    )
    # Values are keyed by the program's keys; inputs keep their names for the KV-name rules.
    renamed = {key: name for name, key in function.inputs.items()}
    renamed.update({key: name for name, key in function.outputs.items()})
    graph.inputs = {renamed[key]: tensor for key, tensor in graph.inputs.items()}
    graph.outputs = [renamed.get(key, key) for key in graph.outputs]
    graph.types.update(graph.inputs)
    constant_keys = {
        key for operation in function.operations if operation.kind == "constant"
        for key in operation.results
    }  # fmt: skip
    for operation in function.operations:
        kind = _kind(operation.kind, operation.operands, constant_keys)
        results = [renamed.get(key, key) for key in operation.results]
        op = Op(
            type=kind,
            name=operation.name,
            inputs=_inputs(kind, [renamed.get(key, key) for key in operation.operands]),
            outputs=results,
        )
        outputs = {
            name: _tensor(kind_)
            for name, kind_ in zip(results, operation.result_types, strict=True)
        }
        constants = []
        if operation.read_constant is not None:
            constants.append(
                Constant(
                    op=op,
                    parameter="val",
                    tensor=_stored(operation.result_types[0], operation.splat),
                    stored_at=("resource", operation.resource) if operation.resource else None,
                    read=_small(operation.read_constant, operation.result_types[0]),
                )
            )
        graph.add(op, outputs, constants)
    return graph


def _kind(kind: str, operands: list[str], constant_keys: set[str]) -> str:
    if kind == "constant":
        return "const"
    if kind in DECOMPRESSION and all(key in constant_keys for key in operands):
        return DECOMPRESSION[kind]
    return kind


def _stored(value_type: ValueType, splat: bool) -> Tensor:
    """A constant as stored: a splat is one value, whatever shape it fills."""
    if splat:
        return Tensor(shape=(), dtype=value_type.dtype, bits=value_type.bits)
    return _tensor(value_type)


def _small(read, value_type: ValueType):  # type: ignore[no-untyped-def]
    """The analyses read a constant's numbers only when small (shapes, axes, indices)."""

    def reader():  # type: ignore[no-untyped-def]
        return read() if value_type.bytes <= 1 << 16 else None

    return reader


def read_asset(path: Path | str) -> ProgramGraph:
    program = load_program(path)
    functions = {name: function_graph(function) for name, function in program.functions.items()}
    decode = DECODE_FUNCTION if DECODE_FUNCTION in functions else sorted(functions)[0]
    return ProgramGraph(
        functions=functions,
        decode_function=decode,
        metadata=program.metadata,
        weight_file_bytes=program.bytecode_bytes,
        known_ops=KNOWN_OPS,
    )
