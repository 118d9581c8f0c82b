"""What an interpreter run is described and fails with: the specs of a function's inputs,
outputs and states, the NumPy dtype of a MIL type, where an op sits, and the errors naming it.

:mod:`decodebench.formats.coreml.interpreter` imports all of these; callers import them from there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from coremltools.converters.mil.mil import types

from decodebench.formats.coreml.plan import Step
from decodebench.formats.coreml.program import MilError
from decodebench.formats.seam import NonFiniteValue

_SUB_BYTE = {"int4": np.int8, "uint1": np.uint8, "uint2": np.uint8, "uint3": np.uint8}
_SUB_BYTE |= {"uint4": np.uint8, "uint6": np.uint8}


class UnsupportedOpError(MilError):
    """The program holds an op the interpreter has no kernel for."""


class InterpreterError(MilError):
    """An op failed, or produced something other than what the program declares."""


class NonFiniteError(InterpreterError, NonFiniteValue):
    """An op produced NaN, or an infinity none of its inputs held (an fp16 overflow)."""

    def __init__(
        self, message: str, op_name: str, op_type: str, function: str | None = None
    ) -> None:
        NonFiniteValue.__init__(self, message, op_name, op_type, function)


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: np.dtype


def numpy_dtype(builtin: Any) -> np.dtype:
    """The NumPy dtype holding a MIL builtin type (sub-byte integers widen to a byte)."""
    name = types.builtin_to_string(builtin)
    if name in _SUB_BYTE:
        return np.dtype(_SUB_BYTE[name])
    return np.dtype(types.nptype_from_builtin(builtin))


def op_location(op: Any, index: int, function: str) -> str:
    outputs = ", ".join(var.name for var in op.outputs)
    location = f"op #{index} '{op.name}' ({op.op_type} -> {outputs}) in function '{function}'"
    scopes = [str(item) for values in getattr(op, "scopes", {}).values() for item in values]
    return f"{location}, scope {' / '.join(scopes)}" if scopes else location


def made_non_finite(
    step: Step,
    slot: int,
    array: np.ndarray,
    reads: Sequence[Any],
    function: str,
    nan: bool | None = None,
) -> NonFiniteError | None:
    """The error naming the op of ``step`` for its non-finite output ``slot``, or None when the
    infinity was passed on from what it read (a -inf mask), not made."""
    nan = bool(np.isnan(array).any()) if nan is None else nan
    if not nan and any(_has_infinity(value) for value in reads):
        return None
    what = "NaN" if nan else "an infinity (fp16 overflow?)"
    count = int((~np.isfinite(array)).sum())
    var = step.op.outputs[step.outputs.index(slot)]
    return NonFiniteError(
        f"{op_location(step.op, step.index, function)} produced {what}: "
        f"{count} of {array.size} values of {var.name!r} are not finite",
        step.op.name,
        step.op.op_type,
        function,
    )


def _has_infinity(value: Any) -> bool:
    array = np.asarray(value)
    return array.dtype.kind == "f" and bool(np.isinf(array).any())
