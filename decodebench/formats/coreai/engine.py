"""The project's engine for Core AI programs: a function planned once (a kernel per operation,
constants read and widened once, each value freed after its last reader), then run on numpy
inputs as Core AI defines the numbers: every result rounded to the type the program declares
(fp16 rounding at each op output, fp32 inside a kernel), and a non-finite value, one that none
of an op's inputs held, refused by naming the op.

Apple's runtime (:mod:`decodebench.formats.coreai.runtime`) is the arbiter of what the
program means; this engine is held to it op by op and on whole decode steps, and is what
verify, the build's checks and the emulated phone run, being some hundred times faster.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from decodebench.formats.coreai.kernels import KERNELS, MOVES, Kernel
from decodebench.formats.coreai.program import CoreAIError, Function, Operation, ValueType
from decodebench.formats.seam import NonFiniteValue

_NUMPY = {
    "float16": np.float16,
    "float32": np.float32,
    "int32": np.int32,
    "int64": np.int64,
    "int16": np.int16,
    "int8": np.int8,
    "uint32": np.uint32,
    "uint64": np.uint64,
    "uint16": np.uint16,
    "uint8": np.uint8,
    "bool": np.bool_,
    # Sub-byte weights (coreai-opt's int4 data, palette indices) are read widened to a byte.
    "int4": np.int8,
    "int2": np.int8,
    "uint6": np.uint8,
    "uint4": np.uint8,
    "uint3": np.uint8,
    "uint2": np.uint8,
    "uint1": np.uint8,
}


class NonFiniteError(CoreAIError, NonFiniteValue):
    """An op made NaN or an infinity none of its inputs held."""

    def __init__(
        self, message: str, op_name: str, op_type: str, function: str | None = None
    ) -> None:
        NonFiniteValue.__init__(self, message, op_name, op_type, function)


def storage_dtype(value_type: ValueType) -> type[np.generic]:
    found = _NUMPY.get(value_type.dtype)
    if found is None:
        raise CoreAIError(f"values of type {value_type.dtype} are not supported by the engine")
    return found


def declared(value: np.ndarray, value_type: ValueType) -> np.ndarray:
    """``value`` rounded to its declared type; floats are kept widened to fp32 (fp16 values
    exactly, after rounding), integers and booleans in their own type."""
    dtype = storage_dtype(value_type)
    if value_type.dtype == "float16":
        with np.errstate(over="ignore"):  # an overflow becomes inf, which the check names
            return np.asarray(value).astype(np.float16).astype(np.float32)
    if value_type.dtype == "float32":
        return np.asarray(value, dtype=np.float32)
    rounded = np.asarray(value).astype(dtype)
    return rounded


@dataclass
class Step:
    operation: Operation
    kernel: Kernel
    operands: list[str]
    results: list[str]
    types: list[ValueType]
    frees: list[str]
    moves: bool = False  # a kind that only moves values: no rounding, no check


def _same_type(value: np.ndarray, value_type: ValueType) -> bool:
    floating = value_type.dtype in ("float16", "float32")
    return value.dtype == np.float32 if floating else value.dtype == storage_dtype(value_type)


class Engine:
    """One function of a program, planned; :meth:`run` maps input names to output values."""

    def __init__(self, function: Function, label: str = "", check_finite: bool = True) -> None:
        self.function = function
        self.label = label or function.name
        self.check_finite = check_finite
        self.constants: dict[str, np.ndarray] = {}
        self.steps: list[Step] = []
        # Ops on constants only (a weight's dequantization, a transposed weight), computed once
        # when planned; kept so the arbiter holds them as it holds the steps.
        self.folded: list[Step] = []
        self._plan()

    @property
    def inputs(self) -> dict[str, ValueType]:
        return self.function.input_types

    @property
    def outputs(self) -> dict[str, ValueType]:
        return self.function.output_types

    def _plan(self) -> None:
        missing = sorted(
            {op.kind for op in self.function.operations if op.kind != "constant"} - set(KERNELS)
        )
        if missing:
            raise CoreAIError(f"{self.label}: the engine has no kernel for {', '.join(missing)}")
        last_use: dict[str, int] = {}
        for index, operation in enumerate(self.function.operations):
            for key in operation.operands:
                last_use[key] = index
        kept = set(self.function.outputs.values())
        frees: dict[int, list[str]] = {}
        for key, index in last_use.items():
            if key not in kept:
                frees.setdefault(index, []).append(key)
        for index, operation in enumerate(self.function.operations):
            if operation.kind == "constant":
                assert operation.read_constant is not None
                raw = operation.read_constant()
                self.constants[operation.results[0]] = declared(raw, operation.result_types[0])
                continue
            step = Step(
                operation, KERNELS[operation.kind], operation.operands, operation.results,
                operation.result_types, frees.get(index, []), operation.kind in MOVES,
            )  # fmt: skip
            if all(key in self.constants for key in operation.operands):
                # Folded once: a transposed weight, a shape computed from constants.
                arguments = [self.constants[key] for key in operation.operands]
                value = np.ascontiguousarray(declared(step.kernel(arguments), step.types[0]))
                self._check(step, arguments, value)
                self.constants[operation.results[0]] = value
                self.folded.append(step)
                continue
            self.steps.append(step)

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        values: dict[str, np.ndarray] = dict(self.constants)
        for name, key in self.function.inputs.items():
            if name not in feeds:
                raise CoreAIError(f"{self.label}: input {name!r} not fed")
            value_type = self.function.input_types[name]
            fed = np.asarray(feeds[name])
            if value_type.shape is not None and tuple(fed.shape) != value_type.shape:
                raise CoreAIError(
                    f"{self.label}: input {name!r} has shape {list(fed.shape)}, "
                    f"the program takes {list(value_type.shape)}"
                )
            values[key] = declared(fed, value_type)
        for step in self.steps:
            arguments = [values[key] for key in step.operands]
            result = step.kernel(arguments)
            if step.moves and _same_type(result, step.types[0]):
                values[step.results[0]] = result
            else:
                value = declared(result, step.types[0])
                if self.check_finite and value.dtype.kind == "f":
                    self._check(step, arguments, value)
                values[step.results[0]] = value
            for key in step.frees:
                if key not in self.constants:
                    values.pop(key, None)
        return {name: values[key] for name, key in self.function.outputs.items()}

    def _check(self, step: Step, arguments: list[np.ndarray], value: np.ndarray) -> None:
        if np.isfinite(value).all():
            return
        if np.isnan(value).any() or not any(
            argument.dtype.kind == "f" and np.isinf(argument).any() for argument in arguments
        ):
            what = "NaN" if np.isnan(value).any() else "an infinity"
            operation = step.operation
            raise NonFiniteError(
                f"op #{operation.index} {operation.name!r} ({operation.kind} -> "
                f"{step.types[0].dtype}{list(step.types[0].shape or ())}) produced {what} "
                f"in {self.function.name}",
                operation.name,
                operation.kind,
                self.function.name,
            )
