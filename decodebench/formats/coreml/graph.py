"""Read the MIL program of a saved ``.mlpackage`` from its protobuf (the weights stay on disk).

:class:`FunctionGraph` indexes one function: every op (nested blocks included), the type, the
producer and the consumers of every named value, and the constants bound inline. Of the weight
file only tiny blobs are ever read (coremltools stores any constant above 10 elements there,
so an all-zero broadcast operand is one), never the weights themselves.
"""

from __future__ import annotations

import json
import math
import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeAlias

import numpy as np
from coremltools.proto import MIL_pb2, Model_pb2
from google.protobuf.message import DecodeError

# A MIL_pb2.Operation; protobuf classes carry no static types here.
Operation: TypeAlias = Any

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


class AnalysisError(ValueError):
    """The path is not something this module can analyse; the message says what is missing."""


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


def _operations(block: MIL_pb2.Block) -> Iterator[Operation]:
    for operation in block.operations:
        yield operation
        for nested in operation.blocks:
            yield from _operations(nested)


@dataclass
class InlineValue:
    """A constant bound directly to an op's parameter or attribute rather than by name."""

    operation: Operation
    parameter: str
    value: MIL_pb2.Value


@dataclass
class FunctionGraph:
    name: str
    opset: str
    inputs: dict[str, MIL_pb2.ValueType]
    outputs: list[str]
    operations: list[Operation] = field(default_factory=list)
    types: dict[str, MIL_pb2.ValueType] = field(default_factory=dict)
    producers: dict[str, Operation] = field(default_factory=dict)
    consumers: dict[str, list[tuple[Operation, str]]] = field(default_factory=dict)
    inline_values: list[InlineValue] = field(default_factory=list)
    model_directory: Path | None = None

    @classmethod
    def from_proto(
        cls, name: str, function: MIL_pb2.Function, model_directory: Path | None = None
    ) -> FunctionGraph:
        if function.opset in function.block_specializations:
            blocks = [function.block_specializations[function.opset]]
        else:
            blocks = list(function.block_specializations.values())
        graph = cls(
            name=name,
            opset=function.opset,
            inputs={named.name: named.type for named in function.inputs},
            outputs=[output for block in blocks for output in block.outputs],
            model_directory=model_directory,
        )
        graph.types.update(graph.inputs)
        for block in blocks:
            for named in block.inputs:
                graph.types[named.name] = named.type
            for operation in _operations(block):
                graph._add(operation)
        return graph

    def _add(self, operation: Operation) -> None:
        self.operations.append(operation)
        for named in operation.outputs:
            self.types[named.name] = named.type
            self.producers[named.name] = operation
        for nested in operation.blocks:
            for named in nested.inputs:
                self.types[named.name] = named.type
        for parameter, argument in operation.inputs.items():
            for binding in argument.arguments:
                if binding.WhichOneof("binding") == "name":
                    self.consumers.setdefault(binding.name, []).append((operation, parameter))
                elif binding.WhichOneof("binding") == "value":
                    self.inline_values.append(InlineValue(operation, parameter, binding.value))
        for attribute, value in operation.attributes.items():
            if attribute != "name":
                self.inline_values.append(InlineValue(operation, attribute, value))

    @property
    def states(self) -> dict[str, MIL_pb2.ValueType]:
        return {
            name: value_type
            for name, value_type in self.inputs.items()
            if value_type.WhichOneof("type") == "stateType"
        }

    def argument_names(self, operation: Operation, parameter: str) -> list[str]:
        if parameter not in operation.inputs:
            return []
        return [binding.name for binding in operation.inputs[parameter].arguments if binding.name]

    def argument_name(self, operation: Operation, parameter: str) -> str | None:
        names = self.argument_names(operation, parameter)
        return names[0] if names else None

    def constant(self, operation: Operation, parameter: str) -> np.ndarray | None:
        """The value of a parameter bound to an immediate, inline or through a ``const`` op."""
        if parameter not in operation.inputs or not operation.inputs[parameter].arguments:
            return None
        binding = operation.inputs[parameter].arguments[0]
        if binding.WhichOneof("binding") == "value":
            return self._value_array(binding.value)
        producer = self.producers.get(binding.name)
        if producer is None or producer.type != "const" or "val" not in producer.attributes:
            return None
        return self._value_array(producer.attributes["val"])

    def _value_array(self, value: MIL_pb2.Value) -> np.ndarray | None:
        if value.WhichOneof("value") == "blobFileValue" and self.model_directory is not None:
            return small_blob_array(self.model_directory, value)
        return immediate_array(value)

    def bytes_of(self, name: str | None) -> int:
        if name is None or name not in self.types:
            return 0
        return value_bytes(self.types[name])

    def shape_of(self, name: str | None) -> list[int] | None:
        if name is None or name not in self.types:
            return None
        return value_shape(self.types[name])

    def elements_of(self, name: str | None) -> int | None:
        shape = self.shape_of(name)
        return None if shape is None else math.prod(shape)


def op_name(operation: Operation) -> str:
    """The op's own name attribute, else its first output's name."""
    if "name" in operation.attributes:
        strings = operation.attributes["name"].immediateValue.tensor.strings.values
        if strings:
            return str(strings[0])
    return operation.outputs[0].name if operation.outputs else operation.type


def function_graphs(
    spec: Model_pb2.Model, model_directory: Path | None = None
) -> dict[str, FunctionGraph]:
    return {
        name: FunctionGraph.from_proto(name, function, model_directory)
        for name, function in sorted(spec.mlProgram.functions.items())
    }


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
