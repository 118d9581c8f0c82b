"""The kernel registry of the reference interpreter: op type -> NumPy function.

A kernel receives its op's inputs as NumPy arrays (``fp16`` already widened to ``fp32``, see
:mod:`decodebench.formats.coreml.interpreter`) and returns the output(s); the interpreter rounds each output
to the dtype the program declares. Parameters the program leaves out take the spec's default.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

Kernel = Callable[["OpArgs"], Any]
KERNELS: dict[str, Kernel] = {}


class OpArgs:
    """The evaluated inputs of one op, by parameter name."""

    def __init__(
        self, op: Any, values: dict[str, Any], shapes: Sequence[tuple[int, ...] | None] = ()
    ) -> None:
        self.op = op
        self._values = values
        self._shapes = shapes  # the declared output shapes, when the caller knows them

    def __getitem__(self, name: str) -> Any:
        return self._values[name]

    def get(self, name: str, default: Any = None) -> Any:
        value = self._values.get(name)
        return default if value is None else value

    def scalar(self, name: str, default: Any = None) -> Any:
        value = self.get(name, default)
        return value.item() if isinstance(value, np.ndarray) else value

    def ints(self, name: str, default: Sequence[int] | None = None) -> list[int] | None:
        value = self.get(name)
        if value is None:
            return None if default is None else list(default)
        return [int(item) for item in np.asarray(value).reshape(-1)]

    def int_list(self, name: str) -> list[int]:
        """A required integer vector parameter."""
        value = self.ints(name)
        if value is None:
            raise ValueError(f"missing parameter {name!r}")
        return value

    def output_shape(self, index: int = 0) -> tuple[int, ...] | None:
        """The declared output shape when every dimension is known."""
        if self._shapes:
            return self._shapes[index]
        shape = self.op.outputs[index].shape
        if all(isinstance(size, int | np.integer) for size in shape):
            return tuple(int(size) for size in shape)
        return None


def kernel(*op_types: str) -> Callable[[Kernel], Kernel]:
    def register(function: Kernel) -> Kernel:
        for op_type in op_types:
            KERNELS[op_type] = function
        return function

    return register


def normalize_axis(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis
