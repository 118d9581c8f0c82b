"""Static analysis of a saved ``.mlpackage``: op histogram, redundant copies, bytes per token.

Reads only the program protobuf (``Data/<root model>``); the weights file is never loaded, only
its size on disk is looked up. Sizes come from the MIL output types, so nothing is executed.

The bytes-per-token estimate is a first-order roofline (DESIGN §1): decode is memory-bound, and
a token moves

- ``weights``: every weight blob once, at its stored width (an upper bound: an untied embedding
  is only gathered, not read whole);
- ``kv_read``: every state tensor once (the whole cache; a first cut that ignores masking);
- ``kv_write``: the slices written into the states (``slice_update`` updates feeding a state
  write, or the whole value for an unsliced write);
- ``redundant``: every ``tile`` output twice, written and read again.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path

from coremltools.proto import MIL_pb2, Model_pb2
from google.protobuf.message import DecodeError
from pydantic import BaseModel, ConfigDict

from decodebench.profiles import DEVICE_PROFILES, DeviceProfile

# Inline (immediate) tensors at least this big are weights stored in the program itself;
# smaller ones are shapes, axes and scalars.
LARGE_IMMEDIATE_BYTES = 1024
STATE_WRITE_OPS = frozenset({"coreml_update_state", "write_state"})
_SPECIAL_DTYPE_BITS = {"BOOL": 8, "FLOAT8E4M3FN": 8, "FLOAT8E5M2": 8}


class AnalysisError(ValueError):
    """The path is not something this module can analyse; the message says what is missing."""


class TensorRecord(BaseModel):
    """One tensor the analysis singles out: a tile output or a state."""

    model_config = ConfigDict(frozen=True)

    name: str
    shape: list[int]
    dtype: str
    bytes: int


class BytesPerToken(BaseModel):
    model_config = ConfigDict(frozen=True)

    weights: int
    kv_read: int
    kv_write: int
    redundant: int
    total: int


class GraphAnalysis(BaseModel):
    model_config = ConfigDict(frozen=True)

    functions: list[str]
    ops_total: int
    non_const_ops: int
    op_counts: dict[str, int]
    tile_ops: int
    tile_output_bytes: int
    tiles: list[TensorRecord]
    slice_update_ops: int
    state_write_ops: int
    state_read_ops: int
    weight_bytes: int
    weight_file_bytes: int
    state_bytes: int
    states: list[TensorRecord]
    bytes_per_token: BytesPerToken

    def predicted_tok_s(self, profiles: Iterable[DeviceProfile] | None = None) -> dict[str, float]:
        """Roofline tok/s per device class (all known profiles by default)."""
        chosen = DEVICE_PROFILES.values() if profiles is None else profiles
        return {profile.device_class: predict_tok_s(self, profile) for profile in chosen}


def predict_tok_s(analysis: GraphAnalysis, profile: DeviceProfile) -> float:
    return profile.predicted_tok_s(analysis.bytes_per_token.total)


def dtype_bits(data_type: int) -> int:
    """Bits per element of a MIL data type (sub-byte types included); 0 when it has no size."""
    name = MIL_pb2.DataType.Name(data_type)
    if name in _SPECIAL_DTYPE_BITS:
        return _SPECIAL_DTYPE_BITS[name]
    match = re.search(r"(\d+)$", name)
    return int(match.group(1)) if match else 0


def tensor_shape(tensor_type: MIL_pb2.TensorType) -> list[int] | None:
    """The static shape, or None when a dimension is unknown."""
    shape = []
    for dimension in tensor_type.dimensions:
        if dimension.WhichOneof("dimension") != "constant":
            return None
        shape.append(dimension.constant.size)
    return shape


def tensor_bytes(tensor_type: MIL_pb2.TensorType) -> int:
    shape = tensor_shape(tensor_type)
    if shape is None:
        return 0
    return math.ceil(math.prod(shape) * dtype_bits(tensor_type.dataType) / 8)


def _tensor_type(value_type: MIL_pb2.ValueType) -> MIL_pb2.TensorType | None:
    kind = value_type.WhichOneof("type")
    if kind == "tensorType":
        return value_type.tensorType
    if kind == "stateType":
        return _tensor_type(value_type.stateType.wrappedType)
    return None


def _record(name: str, value_type: MIL_pb2.ValueType) -> TensorRecord:
    tensor_type = _tensor_type(value_type)
    if tensor_type is None:
        return TensorRecord(name=name, shape=[], dtype="unknown", bytes=0)
    return TensorRecord(
        name=name,
        shape=tensor_shape(tensor_type) or [],
        dtype=MIL_pb2.DataType.Name(tensor_type.dataType).lower(),
        bytes=tensor_bytes(tensor_type),
    )


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


def _blocks(function: MIL_pb2.Function) -> Iterator[MIL_pb2.Block]:
    if function.opset in function.block_specializations:
        yield function.block_specializations[function.opset]
    else:
        yield from function.block_specializations.values()


def _operations(block: MIL_pb2.Block) -> Iterator[MIL_pb2.Operation]:
    for operation in block.operations:
        yield operation
        for nested in operation.blocks:
            yield from _operations(nested)


def _argument_name(operation: MIL_pb2.Operation, parameter: str) -> str | None:
    if parameter not in operation.inputs:
        return None
    arguments = operation.inputs[parameter].arguments
    return arguments[0].name if arguments and arguments[0].name else None


class _ProgramIndex:
    """Every operation, and the type and producer of every named value, across functions."""

    def __init__(self, program: MIL_pb2.Program) -> None:
        self.operations: list[MIL_pb2.Operation] = []
        self.types: dict[str, MIL_pb2.ValueType] = {}
        self.producers: dict[str, MIL_pb2.Operation] = {}
        self.states: dict[str, MIL_pb2.ValueType] = {}
        for function in program.functions.values():
            for named in function.inputs:
                self.types[named.name] = named.type
                if named.type.WhichOneof("type") == "stateType":
                    self.states.setdefault(named.name, named.type)
            for block in _blocks(function):
                self._add_block(block)

    def _add_block(self, block: MIL_pb2.Block) -> None:
        for named in block.inputs:
            self.types[named.name] = named.type
        for operation in _operations(block):
            self.operations.append(operation)
            for named in operation.outputs:
                self.types[named.name] = named.type
                self.producers[named.name] = operation
            for nested in operation.blocks:
                for named in nested.inputs:
                    self.types[named.name] = named.type

    def value_bytes(self, name: str | None) -> int:
        if name is None or name not in self.types:
            return 0
        tensor_type = _tensor_type(self.types[name])
        return 0 if tensor_type is None else tensor_bytes(tensor_type)

    def written_bytes(self, operation: MIL_pb2.Operation) -> int:
        """Bytes a state write really changes: the slice when the value is a slice_update."""
        parameter = "data" if operation.type == "write_state" else "value"
        name = _argument_name(operation, parameter)
        producer = self.producers.get(name) if name else None
        while producer is not None and producer.type == "cast":
            producer = self.producers.get(_argument_name(producer, "x") or "")
        if producer is not None and producer.type == "slice_update":
            return self.value_bytes(_argument_name(producer, "update"))
        return self.value_bytes(name)


def _const_weight_bytes(operations: Iterable[MIL_pb2.Operation]) -> int:
    seen_blobs: set[tuple[str, int]] = set()
    total = 0
    for operation in operations:
        for value in operation.attributes.values():
            tensor_type = _tensor_type(value.type)
            if tensor_type is None:
                continue
            if value.WhichOneof("value") == "blobFileValue":
                blob = (value.blobFileValue.fileName, value.blobFileValue.offset)
                if blob not in seen_blobs:  # one blob shared by several consts is read once
                    seen_blobs.add(blob)
                    total += tensor_bytes(tensor_type)
            elif operation.type == "const" and value.WhichOneof("value") == "immediateValue":
                size = tensor_bytes(tensor_type)
                if size >= LARGE_IMMEDIATE_BYTES:
                    total += size
    return total


def _directory_bytes(directory: Path) -> int:
    if not directory.is_dir():
        return 0
    return sum(item.stat().st_size for item in directory.rglob("*") if item.is_file())


def analyze_mlpackage(path: Path | str) -> GraphAnalysis:
    """Analyse a saved ``.mlpackage`` without loading its weights or running it."""
    spec, model_directory = load_program(path)
    index = _ProgramIndex(spec.mlProgram)
    op_counts = Counter(operation.type for operation in index.operations)

    tiles = [
        _record(named.name, named.type)
        for operation in index.operations
        if operation.type == "tile"
        for named in operation.outputs
    ]
    state_writes = [op for op in index.operations if op.type in STATE_WRITE_OPS]
    states = [_record(name, value_type) for name, value_type in index.states.items()]

    weight_bytes = _const_weight_bytes(index.operations)
    state_bytes = sum(state.bytes for state in states)
    tile_output_bytes = sum(tile.bytes for tile in tiles)
    kv_write = sum(index.written_bytes(operation) for operation in state_writes)
    redundant = 2 * tile_output_bytes
    return GraphAnalysis(
        functions=sorted(spec.mlProgram.functions),
        ops_total=sum(op_counts.values()),
        non_const_ops=sum(op_counts.values()) - op_counts.get("const", 0),
        op_counts=dict(op_counts.most_common()),
        tile_ops=op_counts.get("tile", 0),
        tile_output_bytes=tile_output_bytes,
        tiles=tiles,
        slice_update_ops=op_counts.get("slice_update", 0),
        state_write_ops=len(state_writes),
        state_read_ops=op_counts.get("read_state", 0),
        weight_bytes=weight_bytes,
        weight_file_bytes=_directory_bytes(model_directory / "weights"),
        state_bytes=state_bytes,
        states=states,
        bytes_per_token=BytesPerToken(
            weights=weight_bytes,
            kv_read=state_bytes,
            kv_write=kv_write,
            redundant=redundant,
            total=weight_bytes + state_bytes + kv_write + redundant,
        ),
    )
