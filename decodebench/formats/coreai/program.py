"""An ``.aimodel`` asset's program, read once into plain Python: functions, their named inputs
and outputs, and their operations in order, each with the values it reads and makes.

Every Core AI operation takes its parameters as operands (shapes, axes and permutations are
``coreai.constant`` values), so an operation is its kind and a list of value keys. A
decomposable operation (``coreai.decomposable.broadcasting_add``) is read as its own kind
(``broadcasting_add``); its decomposition is the compiler's business. Constants are read on
demand: small ones inline, weights through the asset's resource blobs.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from decodebench.analysis.graph import AnalysisError

ASSET_SUFFIX = ".aimodel"
BYTECODE = "main.mlirb"
METADATA_KEY = "decodebench"
_TENSOR = re.compile(r"^tensor<(?:(?P<dims>[0-9?x]*)x)?(?P<element>[a-z]+[0-9]*)>$")
# Element types as Core AI prints them -> (numpy-style dtype name, bits).
ELEMENT_TYPES: dict[str, tuple[str, int]] = {
    "f16": ("float16", 16),
    "f32": ("float32", 32),
    "bf16": ("bfloat16", 16),
    "si32": ("int32", 32),
    "si64": ("int64", 64),
    "si16": ("int16", 16),
    "si8": ("int8", 8),
    "ui32": ("uint32", 32),
    "ui64": ("uint64", 64),
    "ui16": ("uint16", 16),
    "ui8": ("uint8", 8),
    "si4": ("int4", 4),
    "ui4": ("uint4", 4),
    "si2": ("int2", 2),
    "ui6": ("uint6", 6),
    "ui3": ("uint3", 3),
    "ui2": ("uint2", 2),
    "ui1": ("uint1", 1),
    "i1": ("bool", 8),
}


class CoreAIError(AnalysisError):
    """An asset that cannot be read or run; the message names the asset, function or op."""


@dataclass(frozen=True)
class ValueType:
    shape: tuple[int, ...] | None
    dtype: str
    bits: int

    @property
    def bytes(self) -> int:
        return 0 if self.shape is None else math.ceil(math.prod(self.shape) * self.bits / 8)


def parse_type(text: str) -> ValueType:
    """``tensor<1x8x64xf16>`` -> ValueType((1, 8, 64), "float16", 16)."""
    match = _TENSOR.match(text.strip())
    if match is None:
        return ValueType(None, text, 0)
    element = match.group("element")
    dtype, bits = ELEMENT_TYPES.get(element, (element, 0))
    dims = match.group("dims")
    if dims is None:
        return ValueType((), dtype, bits)
    if "?" in dims:
        return ValueType(None, dtype, bits)
    return ValueType(tuple(int(size) for size in dims.split("x")), dtype, bits)


@dataclass(eq=False)
class Operation:
    """One operation: its kind (``reshape``, ``broadcasting_mul``), its position in its
    function, the keys of the values it reads and makes, and, for a constant, its reader."""

    kind: str
    index: int
    operands: list[str]
    results: list[str]
    result_types: list[ValueType]
    read_constant: Callable[[], np.ndarray] | None = None
    resource: str | None = None  # the blob a resource-backed constant reads
    splat: bool = False  # a constant the program stores as one value repeated
    type_texts: list[str] = field(default_factory=list)  # result types as Core AI prints them

    @property
    def name(self) -> str:
        return f"{self.kind}_{self.index}"


@dataclass
class Function:
    name: str
    inputs: dict[str, str]  # input name -> value key
    input_types: dict[str, ValueType]
    outputs: dict[str, str]  # output name -> value key
    output_types: dict[str, ValueType]
    operations: list[Operation] = field(default_factory=list)
    types: dict[str, ValueType] = field(default_factory=dict)


@dataclass
class Program:
    path: Path
    functions: dict[str, Function]
    metadata: dict[str, str]
    bytecode_bytes: int
    # The SDK's module the constant readers point into: freed with it, they would read freed memory.
    module: Any = field(default=None, repr=False)


def _names(attribute: Any, count: int, fallback: str) -> list[str]:
    names = []
    for index in range(count):
        entry = attribute[index] if attribute is not None else None
        text = (
            str(entry["coreai.name"]).strip('"')
            if entry is not None and "coreai.name" in entry
            else ""
        )
        names.append(text or f"{fallback}{index}")
    return names


def _reader(operation: Any, value_type: ValueType, mlir_type: Any) -> Callable[[], np.ndarray]:
    from coreai._compiler._mlir_libs._coreaiIR import _bindings

    attribute = operation.attributes["value"]

    def read() -> np.ndarray:
        if value_type.bits < 8 and value_type.dtype != "bool":
            splat = _splat_value(attribute)
            if splat is not None:  # the SDK cannot turn a sub-byte splat into a buffer
                return np.full(value_type.shape or (), splat, dtype=_unpacked(value_type))
        else:
            array = np.array(attribute)
            if array.dtype != np.object_:
                return _as_dtype(array, value_type)
        size = math.ceil(math.prod(value_type.shape or ()) * value_type.bits / 8)
        raw = np.zeros(size, dtype=np.uint8)
        _bindings.compiler.copy_constant_value_to_array(constant_op=operation, destination=raw)
        if value_type.bits < 8 and value_type.dtype.startswith(("int", "uint")):
            return unpack_bits(raw, value_type)
        if value_type.bits < 8 or value_type.dtype == "bfloat16":
            return raw  # packed: the engine unpacks what it understands
        return raw.view(np.dtype(value_type.dtype)).reshape(value_type.shape or ())

    del mlir_type
    return read


def _unpacked(value_type: ValueType) -> type[np.generic]:
    return np.uint8 if value_type.dtype.startswith("uint") else np.int8


def _splat_value(attribute: Any) -> float | None:
    """The one value of a splat constant (``dense<0> : tensor<512x8xsi4>``), else None."""
    from coreai._compiler import ir

    try:
        dense = ir.DenseElementsAttr(attribute)
    except (TypeError, ValueError):
        return None  # a resource blob
    if not dense.is_splat:
        return None
    value = dense.get_splat_value()
    return (
        int(ir.IntegerAttr(value))
        if ir.IntegerAttr.isinstance(value)
        else float(ir.FloatAttr(value))
    )


def unpack_bits(raw: np.ndarray, value_type: ValueType) -> np.ndarray:
    """Sub-byte integers as Core AI packs them (element i in bits i*n..i*n+n-1 of a
    little-endian bit stream: int4 low nibble first), widened to int8 or uint8."""
    bits, shape = value_type.bits, value_type.shape or ()
    count = math.prod(shape)
    stream = np.unpackbits(raw, bitorder="little")[: count * bits].reshape(count, bits)
    values = stream.astype(np.int16) @ (1 << np.arange(bits, dtype=np.int16))
    if not value_type.dtype.startswith("uint"):
        values = np.where(values >= 1 << (bits - 1), values - (1 << bits), values)
    return values.astype(_unpacked(value_type)).reshape(shape)


def _as_dtype(array: np.ndarray, value_type: ValueType) -> np.ndarray:
    shape = value_type.shape or ()
    if value_type.dtype in ("bool",):
        return np.broadcast_to(array.astype(bool), shape).copy()
    try:
        dtype = np.dtype(value_type.dtype)
    except TypeError:
        return array
    return np.broadcast_to(array.astype(dtype), shape).copy()


def _function(graph: Any) -> Function:
    from coreai._compiler import ir

    attributes = graph.attributes
    name = str(attributes["sym_name"]).strip('"')
    state = ir.AsmState(graph)
    block = graph.regions[0].blocks[0]
    arguments = list(block.arguments)
    input_names = _names(
        attributes["arg_attrs"] if "arg_attrs" in attributes else None, len(arguments), "input_"
    )
    function = Function(name, {}, {}, {}, {})
    for input_name, argument in zip(input_names, arguments, strict=True):
        key = argument.get_name(state)
        function.inputs[input_name] = key
        function.input_types[input_name] = function.types[key] = parse_type(str(argument.type))
    for index, item in enumerate(block.operations):
        operation = item.operation
        kind = operation.name.removeprefix("coreai.").removeprefix("decomposable.")
        if kind == "output":
            keys = [operand.get_name(state) for operand in operation.operands]
            names = _names(
                attributes["res_attrs"] if "res_attrs" in attributes else None, len(keys), "output_"
            )
            function.outputs = dict(zip(names, keys, strict=True))
            function.output_types = {
                out: function.types[key] for out, key in function.outputs.items()
            }
            continue
        results = [result.get_name(state) for result in operation.results]
        types = [parse_type(str(result.type)) for result in operation.results]
        function.types.update(zip(results, types, strict=True))
        op = Operation(
            kind, index, [operand.get_name(state) for operand in operation.operands], results,
            types, type_texts=[str(result.type) for result in operation.results],
        )  # fmt: skip
        if kind == "constant":
            value_text = str(operation.attributes["value"])
            op.read_constant = _reader(operation, types[0], operation.results[0].type)
            op.splat = _splat_value(operation.attributes["value"]) is not None
            if value_text.startswith("dense_resource<"):
                op.resource = value_text.split("<", 1)[1].split(">", 1)[0]
        function.operations.append(op)
    return function


def is_asset(path: Path) -> bool:
    return path.suffix == ASSET_SUFFIX and (path / BYTECODE).is_file()


def load_program(path: Path | str) -> Program:
    """The program of the asset at ``path``; CoreAIError naming what is wrong."""
    root = Path(path)
    if not root.is_dir() or root.suffix != ASSET_SUFFIX:
        raise CoreAIError(f"{root}: not a Core AI asset (a folder named *{ASSET_SUFFIX})")
    if not (root / BYTECODE).is_file():
        raise CoreAIError(f"{root}: no {BYTECODE} (the asset's program)")
    from coreai.authoring.asset import AIModelAsset

    try:
        asset = AIModelAsset.load(root)
        module = asset.program._module._mlir_module  # noqa: SLF001 - the program's MLIR
    except Exception as error:  # noqa: BLE001 - the SDK raises bare RuntimeErrors
        raise CoreAIError(f"{root}: Core AI cannot read the asset: {error}") from error
    functions: dict[str, Function] = {}
    for item in module.body.operations:
        operation = item.operation
        if operation.name != "coreai.graph":
            continue
        function = _function(operation)
        functions[function.name] = function
    if not functions:
        raise CoreAIError(f"{root}: the program has no coreai.graph function")
    size = (root / BYTECODE).stat().st_size
    return Program(root, functions, read_metadata(root), size, module=(asset, module))


def read_metadata(root: Path) -> dict[str, str]:
    """The build's metadata, written under the asset's custom metadata (strings)."""
    try:
        document = json.loads((root / "metadata.json").read_text())
    except (OSError, ValueError):
        return {}
    custom = document.get("customMetadata") or document.get("custom_metadata") or {}
    held = custom.get(METADATA_KEY, {}) if isinstance(custom, dict) else {}
    if isinstance(held, str):
        try:
            held = json.loads(held)
        except ValueError:
            return {}
    return {str(key): str(value) for key, value in held.items()} if isinstance(held, dict) else {}
