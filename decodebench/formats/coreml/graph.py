"""Read the MIL program of a saved ``.mlpackage`` from its protobuf (the weights stay on disk).

:func:`read_program` gives the format-neutral :class:`~decodebench.analysis.graph.ProgramGraph`
the analyses read: every op of each function (nested blocks included), the type, the producer
and the consumers of every named value, and the constants bound inline. Of the weight
file only tiny blobs are ever read (coremltools stores any constant above 10 elements there,
so an all-zero broadcast operand is one), never the weights themselves.
"""

from __future__ import annotations

import json
import math
import re
import struct
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from coremltools.proto import MIL_pb2, Model_pb2
from google.protobuf.message import DecodeError

from decodebench.analysis.graph import (
    NOT_A_TENSOR,
    AnalysisError,
    Constant,
    Graph,
    Op,
    ProgramGraph,
    Tensor,
)
from decodebench.formats.coreml.known_ops import KNOWN_OPS

_SPECIAL_DTYPE_BITS = {"BOOL": 8, "FLOAT8E4M3FN": 8, "FLOAT8E5M2": 8}
_NUMPY_DTYPES = {
    "FLOAT16": np.float16,
    "FLOAT32": np.float32,
    "FLOAT64": np.float64,
    "INT8": np.int8,
    "UINT8": np.uint8,
    "INT16": np.int16,
    "UINT16": np.uint16,
    "INT32": np.int32,
    "UINT32": np.uint32,
    "INT64": np.int64,
    "UINT64": np.uint64,
    "BOOL": np.bool_,
}


# Blobs up to this size may be read to learn a constant's values (identity operands, indices).
SMALL_BLOB_BYTES = 4096
# MILBlob storage: each blob starts with a 64-byte header, sentinel, dtype, size, data offset.
_BLOB_SENTINEL = 0xDEADBEEF
_BLOB_HEADER = struct.Struct("<IIQQ")


def load_program(path: Path | str) -> tuple[Model_pb2.Model, Path]:
    """The root model spec of an ``.mlpackage`` and the directory it lives in."""
    package = Path(path)
    prefix = f"{package} is not an .mlpackage:"
    if not package.exists():
        raise AnalysisError(f"{prefix} the path does not exist")
    if not package.is_dir():
        raise AnalysisError(f"{prefix} it is a file, not a package directory")
    manifest_path = package / "Manifest.json"
    if not manifest_path.is_file():
        raise AnalysisError(f"{prefix} Manifest.json is missing")
    try:
        manifest = json.loads(manifest_path.read_text())
        root = manifest["itemInfoEntries"][manifest["rootModelIdentifier"]]["path"]
    except (ValueError, KeyError, TypeError) as error:
        raise AnalysisError(f"{prefix} Manifest.json names no root model ({error})") from None
    model_path = package / "Data" / root
    if not model_path.is_file():
        raise AnalysisError(f"{prefix} the root model Data/{root} is missing")
    try:
        spec = Model_pb2.Model.FromString(model_path.read_bytes())
    except DecodeError:
        raise AnalysisError(f"{prefix} Data/{root} is not a Core ML model spec") from None
    kind = spec.WhichOneof("Type")
    if kind != "mlProgram":
        raise AnalysisError(f"{package} is not an mlprogram: its model type is {kind}")
    return spec, model_path.parent


def dtype_name(data_type: int) -> str:
    try:
        return MIL_pb2.DataType.Name(data_type)
    except ValueError:
        return f"UNKNOWN{data_type}"


def dtype_bits(data_type: int) -> int:
    """Bits per element of a MIL data type (sub-byte types included); 0 when it has no size."""
    name = dtype_name(data_type)
    if name in _SPECIAL_DTYPE_BITS:
        return _SPECIAL_DTYPE_BITS[name]
    match = re.search(r"INT(\d+)$|FLOAT(\d+)$", name)
    return int(match.group(1) or match.group(2)) if match else 0


def tensor_type(value_type: MIL_pb2.ValueType) -> MIL_pb2.TensorType | None:
    kind = value_type.WhichOneof("type")
    if kind == "tensorType":
        return value_type.tensorType
    if kind == "stateType":
        return tensor_type(value_type.stateType.wrappedType)
    return None


def tensor_shape(tensor: MIL_pb2.TensorType) -> list[int] | None:
    """The static shape, or None when a dimension is unknown."""
    shape = []
    for dimension in tensor.dimensions:
        if dimension.WhichOneof("dimension") != "constant":
            return None
        shape.append(dimension.constant.size)
    return shape


def tensor_bytes(tensor: MIL_pb2.TensorType) -> int:
    shape = tensor_shape(tensor)
    if shape is None:
        return 0
    return math.ceil(math.prod(shape) * dtype_bits(tensor.dataType) / 8)


def value_bytes(value_type: MIL_pb2.ValueType) -> int:
    tensor = tensor_type(value_type)
    return 0 if tensor is None else tensor_bytes(tensor)


def value_shape(value_type: MIL_pb2.ValueType) -> list[int] | None:
    tensor = tensor_type(value_type)
    return None if tensor is None else tensor_shape(tensor)


def value_dtype(value_type: MIL_pb2.ValueType) -> str:
    tensor = tensor_type(value_type)
    return "unknown" if tensor is None else dtype_name(tensor.dataType).lower()


def immediate_array(value: MIL_pb2.Value) -> np.ndarray | None:
    """The numbers of an immediate tensor value, or None (blob-stored, strings, unknown dtype)."""
    if value.WhichOneof("value") != "immediateValue":
        return None
    if value.immediateValue.WhichOneof("value") != "tensor":
        return None
    tensor = tensor_type(value.type)
    if tensor is None:
        return None
    shape = tensor_shape(tensor)
    payload = value.immediateValue.tensor
    kind = payload.WhichOneof("value")
    array: np.ndarray
    if kind in ("floats", "ints", "bools", "longInts", "doubles"):
        array = np.array(list(getattr(payload, kind).values))
    elif kind == "bytes":
        numpy_dtype = _NUMPY_DTYPES.get(dtype_name(tensor.dataType))
        if numpy_dtype is None:
            return None
        array = np.frombuffer(payload.bytes.values, dtype=numpy_dtype)
    else:
        return None
    if shape is not None and math.prod(shape) == array.size:
        array = array.reshape(shape)
    return array


def small_blob_array(model_directory: Path, value: MIL_pb2.Value) -> np.ndarray | None:
    """The numbers of a blob-stored constant of at most SMALL_BLOB_BYTES, else None."""
    tensor = tensor_type(value.type)
    if tensor is None or value.WhichOneof("value") != "blobFileValue":
        return None
    shape = tensor_shape(tensor)
    numpy_dtype = _NUMPY_DTYPES.get(dtype_name(tensor.dataType))
    if shape is None or numpy_dtype is None or tensor_bytes(tensor) > SMALL_BLOB_BYTES:
        return None
    blob = value.blobFileValue
    path = model_directory / blob.fileName.removeprefix("@model_path/")
    try:
        with path.open("rb") as weights:
            weights.seek(blob.offset)
            sentinel, _, size, data_offset = _BLOB_HEADER.unpack(weights.read(_BLOB_HEADER.size))
            if sentinel != _BLOB_SENTINEL or size > SMALL_BLOB_BYTES:
                return None
            weights.seek(data_offset)
            raw = weights.read(size)
    except (OSError, struct.error):
        return None
    count = math.prod(shape)
    array: np.ndarray = np.frombuffer(raw, dtype=numpy_dtype)
    return array[:count].reshape(shape) if array.size >= count else None


def _operations(block: MIL_pb2.Block) -> Iterator[MIL_pb2.Operation]:
    for operation in block.operations:
        yield operation
        for nested in operation.blocks:
            yield from _operations(nested)


def tensor_of(value_type: MIL_pb2.ValueType) -> Tensor:
    """The neutral static type of a MIL value type (a state is its wrapped tensor, marked)."""
    tensor = tensor_type(value_type)
    if tensor is None:
        return NOT_A_TENSOR
    shape = tensor_shape(tensor)
    return Tensor(
        shape=None if shape is None else tuple(shape),
        dtype=dtype_name(tensor.dataType).lower(),
        bits=dtype_bits(tensor.dataType),
        state=value_type.WhichOneof("type") == "stateType",
    )


def op_name(operation: MIL_pb2.Operation) -> str:
    """The op's own name attribute, else its first output's name."""
    if "name" in operation.attributes:
        strings = operation.attributes["name"].immediateValue.tensor.strings.values
        if strings:
            return str(strings[0])
    return operation.outputs[0].name if operation.outputs else operation.type


def _constant(
    op: Op, parameter: str, value: MIL_pb2.Value, model_directory: Path | None
) -> Constant:
    stored_at = None
    if value.WhichOneof("value") == "blobFileValue":
        blob = value.blobFileValue
        stored_at = (blob.fileName, str(blob.offset))

    def read() -> np.ndarray | None:
        if stored_at is not None:
            return None if model_directory is None else small_blob_array(model_directory, value)
        return immediate_array(value)

    return Constant(op, parameter, tensor_of(value.type), stored_at, read)


def _add(graph: Graph, operation: MIL_pb2.Operation, model_directory: Path | None) -> None:
    op = Op(type=operation.type, name=op_name(operation))
    outputs = {named.name: tensor_of(named.type) for named in operation.outputs}
    op.outputs = list(outputs)
    constants = []
    for parameter, argument in operation.inputs.items():
        names = op.inputs.setdefault(parameter, [])
        for binding in argument.arguments:
            if binding.WhichOneof("binding") == "name":
                names.append(binding.name)
            elif binding.WhichOneof("binding") == "value":
                constants.append(_constant(op, parameter, binding.value, model_directory))
    for attribute, value in operation.attributes.items():
        if attribute != "name":
            constants.append(_constant(op, attribute, value, model_directory))
    for nested in operation.blocks:
        for named in nested.inputs:
            graph.types[named.name] = tensor_of(named.type)
    graph.add(op, outputs, constants)


def function_graph(
    name: str, function: MIL_pb2.Function, model_directory: Path | None = None
) -> Graph:
    """One MIL function as the neutral :class:`~decodebench.analysis.graph.Graph`."""
    if function.opset in function.block_specializations:
        blocks = [function.block_specializations[function.opset]]
    else:
        blocks = list(function.block_specializations.values())
    graph = Graph(
        name=name,
        opset=function.opset,
        inputs={named.name: tensor_of(named.type) for named in function.inputs},
        outputs=[output for block in blocks for output in block.outputs],
    )
    graph.types.update(graph.inputs)
    for block in blocks:
        for named in block.inputs:
            graph.types[named.name] = tensor_of(named.type)
        for operation in _operations(block):
            _add(graph, operation, model_directory)
    return graph


def function_graphs(spec: Model_pb2.Model, model_directory: Path | None = None) -> dict[str, Graph]:
    return {
        name: function_graph(name, function, model_directory)
        for name, function in sorted(spec.mlProgram.functions.items())
    }


def _directory_bytes(directory: Path) -> int:
    if not directory.is_dir():
        return 0
    return sum(item.stat().st_size for item in directory.rglob("*") if item.is_file())


def read_program(path: Path | str) -> ProgramGraph:
    """A saved ``.mlpackage`` as the analyses read it (weights stay on disk)."""
    spec, model_directory = load_program(path)
    decode = decode_function_name(spec)
    if decode is None:
        raise AnalysisError(f"{path} is an mlprogram without functions")
    return ProgramGraph(
        functions=function_graphs(spec, model_directory),
        decode_function=decode,
        metadata=dict(spec.description.metadata.userDefined),
        weight_file_bytes=_directory_bytes(model_directory / "weights"),
        known_ops=KNOWN_OPS,
    )


def decode_function_name(spec: Model_pb2.Model) -> str | None:
    """The function a decoded token runs: one named like ``decode``, else the default one."""
    names = sorted(spec.mlProgram.functions)
    if not names:
        return None
    for name in names:
        if "decode" in name.lower():
            return name
    default = spec.description.defaultFunctionName
    if default in names:
        return default
    return "main" if "main" in names else names[0]
