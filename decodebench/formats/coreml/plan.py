"""The compiled form of one function: a flat list of steps over numbered value slots.

:class:`decodebench.formats.coreml.interpreter.Interpreter` compiles its function once (at its first run)
instead of walking pymil's operations and dictionaries per op per step: every value gets a slot,
every op a :class:`Step` holding its kernel, the slots of its inputs by parameter name, the
dtypes and shapes its outputs are declared with, and the slots whose last reader it is (freed
after it runs). Constants sit in a template the slots of every run start from, fp16 ones already
widened to fp32 (within :data:`WIDE_CONSTANT_BUDGET`); ``constexpr_*`` ops run in the first run
only (their outputs are checked like any op's), then their decompressed, widened weights join the
template: weights are decompressed and widened once per program.

Nothing here changes what a kernel computes: the same kernels get the same fp32 operands, and
every output is rounded to its declared dtype exactly as before.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from decodebench.formats.coreml.ops_math import ELEMENTWISE
from decodebench.formats.coreml.registry import KERNELS

# fp16 weights widened to fp32 are kept up to this size, so each step does not widen them again
# (half the time of a step otherwise); larger models widen the rest on every use.
WIDE_CONSTANT_BUDGET = 2 * 2**30
FP16 = np.dtype(np.float16)
SMALL = 1024  # up to this many values, isfinite beats the exponent-bits check (2.5x at 1 value)
FP32 = np.dtype(np.float32)

# Ops that only move, pick or copy values: computed on their inputs as they are (an fp16 tensor
# widened to fp32 and rounded back is the same tensor, so skipping both changes no bit).
MOVES = frozenset(
    {"reshape", "transpose", "expand_dims", "squeeze", "slice_by_index", "slice_by_size"}
    | {"concat", "stack", "split", "tile", "gather", "identity", "slice_update"}
)
# Ops whose outputs hold only values of their inputs (or |values|, or the larger of two): given
# checked inputs of their own dtype, they cannot make a NaN or an overflow, so their outputs are
# not checked again.
PASS_ON = MOVES | {"abs", "maximum", "minimum", "relu", "select"}

KERNEL, READ_STATE, UPDATE_STATE, WRITE_STATE, CONSTEXPR, OVERRIDDEN = range(6)
# A KV cache update written into the state itself: read_state -> slice_update -> update_state.
READ_STATE_SHARED, SLICE_UPDATE_IN_PLACE = 6, 7


@dataclass(slots=True)
class Step:
    """One op of the plan."""

    index: int  # the op's position in the function (for error messages)
    op: Any
    kind: int
    kernel: Any
    params: tuple[tuple[str, Any], ...]  # parameter name -> slot, or tuple of slots (a list)
    outputs: tuple[int, ...]
    dtypes: tuple[np.dtype, ...]
    shapes: tuple[tuple[int, ...] | None, ...]
    reads: tuple[int, ...]  # every input slot, for the non-finite check
    frees: tuple[int, ...]  # slots last read here
    state: str = ""
    value: int = -1  # the slot a state op writes from
    wide: bool = True  # widen fp16 operands to fp32 (False: a move, see MOVES)
    checks: tuple[int, ...] = ()  # float output slots the non-finite check looks at
    function: Any = None  # an elementwise op on floats: its NumPy function, called directly
    operands: tuple[int, ...] = ()  # ... on these slots (x, or x and y)


@dataclass
class Plan:
    steps: list[Step]
    template: list[Any]  # constants (widened where the budget allows); None for computed values
    slots: dict[int, int]  # id(var) -> slot
    inputs: dict[str, int]  # function input name -> slot
    outputs: list[tuple[str, int, Any]]  # output name, slot, its constant value (or None)
    wide_bytes: int = 0


def static_shape(var: Any) -> tuple[int, ...] | None:
    shape = var.shape
    if all(isinstance(size, int | np.integer) for size in shape):
        return tuple(int(size) for size in shape)
    return None


def input_vars(op: Any) -> list[Any]:
    found: list[Any] = []
    for var in op.inputs.values():
        found.extend(var if isinstance(var, list | tuple) else [var])
    return found


def widen(value: Any) -> Any:
    if isinstance(value, np.ndarray) and value.dtype == FP16:
        return value.astype(np.float32)
    if isinstance(value, np.float16):
        return np.float32(value)
    return value


def compile_plan(
    operations: list[Any],
    function: Any,
    state_names: Mapping[int, str],
    dtype_of: Any,
    overridden: bool,
) -> Plan:
    """The plan of ``operations`` (``overridden``: every op goes through ``_execute``)."""
    slots: dict[int, int] = {}
    template: list[Any] = []
    plan = Plan([], template, slots, {}, [])

    def slot(var: Any) -> int:
        found = slots.get(id(var))
        if found is None:
            found = slots[id(var)] = len(template)
            template.append(None)
            if var.op is not None and var.op.op_type == "const":
                template[found] = _constant(plan, var.val)
        return found

    for name, var in function.inputs.items():
        plan.inputs[name] = slot(var)
    last: dict[int, int] = {}
    for index, op in enumerate(operations):
        for var in input_vars(op):
            last[slot(var)] = index
    outputs = [slot(var) for var in function.outputs]
    for output in outputs:
        last[output] = len(operations)
    if not overridden:  # decompressed weights are kept (they join the template), never freed
        for op in operations:
            if op.op_type.startswith("constexpr_"):
                for var in op.outputs:
                    last[slot(var)] = len(operations)
    for var, output in zip(function.outputs, outputs, strict=True):
        constant = var.val if var.op is not None and var.op.op_type == "const" else None
        plan.outputs.append((var.name, output, constant))

    for index, op in enumerate(operations):
        if op.op_type != "const":
            plan.steps.append(_step(index, op, slot, last, state_names, dtype_of, overridden))
    fuse_state_updates(plan, set(outputs))
    return plan


def _step(
    index: int,
    op: Any,
    slot: Callable[[Any], int],
    last: Mapping[int, int],
    state_names: Mapping[int, str],
    dtype_of: Any,
    overridden: bool,
) -> Step:
    """The step of ``op`` (not a ``const``): its kind, kernel, operand and output slots, the
    slots it frees (``last``: slot -> index of its last reader) and the outputs it checks."""
    op_type = op.op_type
    reads = tuple(slot(var) for var in input_vars(op))
    params = tuple(
        (
            name,
            tuple(slot(item) for item in var) if isinstance(var, list | tuple) else slot(var),
        )
        for name, var in op.inputs.items()
    )
    kind, kernel, state, value = KERNEL, KERNELS.get(op_type), "", -1
    if op_type == "read_state":
        kind, state = READ_STATE, state_names.get(id(op.inputs["input"]), "")
    elif op_type == "coreml_update_state":
        kind, state = UPDATE_STATE, state_names.get(id(op.inputs["state"]), "")
        value = slot(op.inputs["value"])
    elif op_type == "write_state":
        kind, state = WRITE_STATE, state_names.get(id(op.inputs["input"]), "")
        value = slot(op.inputs["data"])
    elif overridden:
        kind = OVERRIDDEN
    elif op_type.startswith("constexpr_"):
        kind = CONSTEXPR
    dtypes = tuple(dtype_of(var.dtype) for var in op.outputs)
    checks = tuple(
        slot(var) for var, dtype in zip(op.outputs, dtypes, strict=True) if dtype.kind == "f"
    )
    if op_type in PASS_ON and _passes_checked_values(op, dtypes, dtype_of):
        checks = ()
    return Step(
        index=index,
        op=op,
        kind=kind,
        kernel=kernel,
        params=params,
        outputs=tuple(slot(var) for var in op.outputs),
        dtypes=dtypes,
        shapes=tuple(static_shape(var) for var in op.outputs),
        reads=reads,
        frees=tuple(sorted({s for s in reads if last.get(s) == index})),
        state=state,
        value=value,
        wide=op_type not in MOVES or kind != KERNEL,
        checks=checks,
        **(elementwise(op, kernel, params, dtype_of) if kind == KERNEL else {}),
    )


def elementwise(op: Any, kernel: Any, params: Any, dtype_of: Any) -> dict[str, Any]:
    """The direct call of a registered elementwise kernel whose operands are all floats: the
    same NumPy function on the same widened operands, without the kernel's argument lookups."""
    found = ELEMENTWISE.get(op.op_type)
    names = tuple(name for name, _ in params)
    if found is None or found[0] is not kernel or names not in (("x",), ("x", "y")):
        return {}
    if any(dtype_of(var.dtype).kind != "f" for var in input_vars(op)):
        return {}
    return {"function": found[1], "operands": tuple(slot for _, slot in params)}


def _passes_checked_values(op: Any, dtypes: tuple[np.dtype, ...], dtype_of: Any) -> bool:
    """Whether every float input of ``op`` is another op's (checked) output of the dtype of
    every output: then its outputs are finite unless an input passes on an infinity."""
    if any(dtype != dtypes[0] for dtype in dtypes):
        return False
    for var in input_vars(op):
        dtype = dtype_of(var.dtype)
        if dtype.kind != "f":
            continue
        if var.op is None or var.op.op_type == "const" or dtype != dtypes[0]:
            return False
    return True


def fuse_state_updates(plan: Plan, outputs: set[int]) -> None:
    """``read_state`` -> ``slice_update`` -> ``coreml_update_state`` of one state, the read
    read only by the slice_update: the slice is written into the state's storage in place
    instead of the state being copied, widened, copied, rounded and copied again (bit-identical:
    the rest of the state round-trips fp16 -> fp32 -> fp16 exactly, the update is rounded once
    either way)."""
    readers: dict[int, int] = {}
    for step in plan.steps:
        for slot in step.reads:
            readers[slot] = readers.get(slot, 0) + 1
    for position, read in enumerate(plan.steps):
        if read.kind != READ_STATE or not read.state or read.outputs[0] in outputs:
            continue
        state, cache = read.state, read.outputs[0]
        if readers.get(cache) != 1:
            continue
        for update in plan.steps[position + 1 :]:
            if update.state == state or cache in update.reads:
                break
        if update.op.op_type != "slice_update" or dict(update.params).get("x") != cache:
            continue
        if update.reads.count(cache) != 1 or update.outputs[0] in outputs:
            continue
        if update.dtypes[0] != read.dtypes[0]:
            continue
        later = plan.steps[plan.steps.index(update) + 1 :]
        writer = next((step for step in later if step.state == state), None)
        if writer is None or writer.kind != UPDATE_STATE or writer.value != update.outputs[0]:
            continue
        read.kind, update.kind = READ_STATE_SHARED, SLICE_UPDATE_IN_PLACE


def _constant(plan: Plan, value: Any) -> Any:
    """A constant as kernels read it: fp16 widened once, while the budget lasts."""
    widened = widen(value)
    if isinstance(widened, np.ndarray) and widened is not value:
        if plan.wide_bytes + widened.nbytes > WIDE_CONSTANT_BUDGET:
            return value
        plan.wide_bytes += widened.nbytes
    return widened


def settle_constexpr(plan: Plan, values: list[Any]) -> None:
    """After a first run: constexpr outputs become constants, their steps leave the plan."""
    for step in plan.steps:
        if step.kind == CONSTEXPR:
            for output in step.outputs:
                plan.template[output] = _constant(plan, values[output])
    plan.steps = [step for step in plan.steps if step.kind != CONSTEXPR]


def all_finite(array: np.ndarray) -> bool:
    """Whether a float array holds only finite values, in one cheap pass: a large fp16 array by
    its exponent bits (all ones is an infinity or a NaN: a tenth of widening it), anything else
    by ``isfinite`` (for a few hundred values the call costs more than the values)."""
    if array.dtype == FP16 and array.size > SMALL:
        return int((array.view(np.uint16) & 0x7C00).max()) != 0x7C00
    return bool(np.isfinite(array).all())


class SlotEnv(Mapping[int, Any]):
    """The slots seen as the ``id(var) -> value`` environment ``Interpreter._execute`` reads."""

    def __init__(self, values: list[Any], slots: dict[int, int]) -> None:
        self._values = values
        self._slots = slots

    def __getitem__(self, key: int) -> Any:
        found = self._slots.get(key)
        if found is None or self._values[found] is None:
            raise KeyError(key)
        return self._values[found]

    def __contains__(self, key: object) -> bool:
        found = self._slots.get(key)  # type: ignore[call-overload]
        return found is not None and self._values[found] is not None

    def __iter__(self) -> Iterator[int]:
        return (key for key, found in self._slots.items() if self._values[found] is not None)

    def __len__(self) -> int:
        return sum(1 for _ in self)
