"""The format-neutral graph the analyses read: ops, named values with their static types, and
the constants bound to ops. A model format reads its package into a :class:`ProgramGraph`
(``decodebench.formats.<name>``); traffic, copies, the op histogram and the doctor's waste list
then work on it without knowing the format or importing its SDK.

Only static facts are kept: a value's shape, dtype and byte size, which op makes it and which
read it. A constant's numbers are read on demand, and only when small (identity operands,
permutations, gather indices); weights stay on disk.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np


class AnalysisError(ValueError):
    """The path is not a package a format can read; the message says what is missing."""


@dataclass(frozen=True)
class Tensor:
    """The static type of a value: ``shape`` is None when a dimension is unknown; ``dtype`` is
    lower case (``float16``, ``int4``, ``bool``); ``state`` marks a model state (a KV cache the
    runtime keeps between calls)."""

    shape: tuple[int, ...] | None
    dtype: str
    bits: int
    state: bool = False

    @property
    def bytes(self) -> int:
        if self.shape is None:
            return 0
        return math.ceil(math.prod(self.shape) * self.bits / 8)


NOT_A_TENSOR = Tensor(shape=None, dtype="unknown", bits=0)


def _nothing() -> np.ndarray | None:
    return None


@dataclass(eq=False)
class Op:
    """One operation: its type, its name, the named values bound to each parameter (inline
    constants are :class:`Constant`), and the values it produces."""

    type: str
    name: str
    inputs: dict[str, list[str]] = field(default_factory=dict)
    outputs: list[str] = field(default_factory=list)


@dataclass(eq=False)
class Constant:
    """A constant bound to an op's parameter or attribute rather than by name. ``stored_at`` is
    where a format keeps it outside the program (file, offset), so one stored blob shared by
    several ops counts once; None when the program holds the numbers itself."""

    op: Op
    parameter: str
    tensor: Tensor
    stored_at: tuple[str, ...] | None = None
    read: Callable[[], np.ndarray | None] = _nothing


@dataclass
class Graph:
    """One function of a program, every op of nested blocks included, indexed by value."""

    name: str
    opset: str
    inputs: dict[str, Tensor]
    outputs: list[str]
    operations: list[Op] = field(default_factory=list)
    types: dict[str, Tensor] = field(default_factory=dict)
    producers: dict[str, Op] = field(default_factory=dict)
    consumers: dict[str, list[tuple[Op, str]]] = field(default_factory=dict)
    constants: list[Constant] = field(default_factory=list)
    _bound: dict[tuple[int, str], Constant] = field(default_factory=dict, repr=False)

    def add(self, operation: Op, outputs: dict[str, Tensor], constants: list[Constant]) -> None:
        """Index ``operation``: the types of what it makes, its consumers' edges, its inline
        constants (the first bound to a parameter is the one :meth:`constant` reads)."""
        self.operations.append(operation)
        for name, tensor in outputs.items():
            self.types[name] = tensor
            self.producers[name] = operation
        for parameter, names in operation.inputs.items():
            for name in names:
                self.consumers.setdefault(name, []).append((operation, parameter))
        for constant in constants:
            self.constants.append(constant)
            self._bound.setdefault((id(operation), constant.parameter), constant)

    @property
    def states(self) -> dict[str, Tensor]:
        return {name: tensor for name, tensor in self.inputs.items() if tensor.state}

    def argument_names(self, operation: Op, parameter: str) -> list[str]:
        return list(operation.inputs.get(parameter, []))

    def argument_name(self, operation: Op, parameter: str) -> str | None:
        names = operation.inputs.get(parameter)
        return names[0] if names else None

    def constant(self, operation: Op, parameter: str) -> np.ndarray | None:
        """The numbers of a parameter bound to a constant, inline or through a ``const`` op."""
        bound = self._bound.get((id(operation), parameter))
        if bound is not None:
            return bound.read()
        name = self.argument_name(operation, parameter)
        producer = self.producers.get(name) if name else None
        if producer is None or producer.type != "const":
            return None
        held = self._bound.get((id(producer), "val"))
        return None if held is None else held.read()

    def tensor(self, name: str | None) -> Tensor:
        if name is None:
            return NOT_A_TENSOR
        return self.types.get(name, NOT_A_TENSOR)

    def bytes_of(self, name: str | None) -> int:
        return self.tensor(name).bytes

    def shape_of(self, name: str | None) -> list[int] | None:
        shape = self.tensor(name).shape
        return None if shape is None else list(shape)

    def elements_of(self, name: str | None) -> int | None:
        shape = self.tensor(name).shape
        return None if shape is None else math.prod(shape)


@dataclass
class ProgramGraph:
    """A package as the analyses see it: its functions, the one a decoded token runs, the
    metadata the build wrote, the bytes its weight files take on disk, and the op types the
    format's runtime is known to run (any other is reported as unknown)."""

    functions: dict[str, Graph]
    decode_function: str
    metadata: dict[str, str]
    weight_file_bytes: int
    known_ops: frozenset[str] = frozenset()
