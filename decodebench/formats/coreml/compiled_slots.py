"""How the compiled plan's source names its values: the slot bookkeeping of the writer.

:mod:`decodebench.formats.coreml.compiled` writes a plan as one Python function. Every plan slot
becomes a local ``v<slot>`` (an fp16 one read by computing ops also a widened ``w<slot>``), or,
for a constant, a global bound once. :class:`SlotWriter` holds what is known of each slot at
write time (dtype, static shape, whether it may hold a state's storage) and turns slots into the
expressions the generated lines use; it emits lines but decides nothing about steps.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from decodebench.formats.coreml import shadows
from decodebench.formats.coreml.plan import FP16, KERNEL, Plan, Step, widen
from decodebench.formats.coreml.registry import OpArgs


def wide_shadow(value: Any) -> Any:
    """What a kernel is given for an fp16 value that may be a state's storage."""
    if value.__class__ is np.ndarray and value.dtype == FP16:
        wide = shadows.shadow(value)
        return value.astype(np.float32) if wide is None else wide
    if value.__class__ is np.float16:
        return np.float32(value)
    return value


def operand_slots(step: Step) -> list[int]:
    """Every slot a step reads through its parameters (lists flattened)."""
    found: list[int] = []
    for _, slot in step.params:
        found.extend(slot if slot.__class__ is tuple else (slot,))
    return found


class SlotWriter:
    """The lines of the generated function so far and what each slot is called in them."""

    def __init__(self, plan: Plan, interpreter: Any, check: bool) -> None:
        self.plan = plan
        self.interpreter = interpreter
        self.check = check
        self.lines: list[str] = []
        self.bound: dict[tuple[str, int], str] = {}
        self.elementwise_constants: dict[int, str] = {}
        self.step: Step | None = None
        self.exact = False  # the last kernel call surely makes an ndarray of the declared shape
        self.owner: dict[int, Step | None] = {}
        self.names: dict[str, Any] = {
            "nd": np.ndarray,
            "asarray": np.asarray,
            "f32": np.float32,
            "vdot": np.vdot,
            "isfinite": math.isfinite,
            "wide_shadow": wide_shadow,
            "OpArgs": OpArgs,
            "widen": widen,
        }
        self.dtype: dict[int, np.dtype | None] = {}  # computed/input slot -> its dtype
        self.shape: dict[int, tuple[int, ...] | None] = {}
        self.storage: set[int] = set()  # slots that may hold a state's storage
        self.widened: set[int] = set()  # slots whose w<slot> exists now
        self.wide_readers: dict[int, int] = {}  # slot -> computing steps reading it widened
        self.constants = {
            slot for slot, value in enumerate(plan.template) if value is not None
        } - set(plan.inputs.values())
        for name, slot in plan.inputs.items():
            spec = interpreter.inputs.get(name)
            self.dtype[slot] = None if spec is None else spec.dtype
            self.shape[slot] = None if spec is None or not spec.shape else spec.shape
        for step in plan.steps:
            for slot, dtype, shape in zip(step.outputs, step.dtypes, step.shapes, strict=True):
                self.dtype[slot], self.shape[slot] = dtype, shape
            if step.kind == KERNEL and (step.wide or step.function is not None):
                for slot in operand_slots(step):
                    self.wide_readers[slot] = self.wide_readers.get(slot, 0) + 1

    # --- names ---------------------------------------------------------------------------

    def bind(self, prefix: str, value: Any) -> str:
        """A global name of the generated function holding ``value`` (one per object)."""
        key = (prefix, id(value))
        name = self.bound.get(key)
        if name is None:
            name = self.bound[key] = f"{prefix}_{len(self.bound)}"  # no fixed name has "_"
            self.names[name] = value
        return name

    def raw(self, slot: int) -> str:
        if slot in self.constants:
            return self.bind("c", self.plan.template[slot])
        return f"v{slot}"

    def wide(self, slot: int, elementwise: bool) -> str:
        """The expression of a slot as a computing op is given it (fp16 widened to fp32)."""
        if slot in self.constants:
            value = self.plan.template[slot]
            if isinstance(value, np.ndarray) and value.dtype == FP16:  # past the widening budget
                return f"{self.bind('c', value)}.astype(f32)"
            if not elementwise:
                return self.bind("c", value)
            if slot not in self.elementwise_constants:
                self.elementwise_constants[slot] = self.bind("c", np.asarray(widen(value)))
            return self.elementwise_constants[slot]
        if self.dtype.get(slot) != FP16:
            return f"v{slot}" if self.dtype.get(slot) is not None else f"wide_shadow(v{slot})"
        if slot in self.storage:
            return f"wide_shadow(v{slot})"
        if slot not in self.widened:
            self.emit(f"w{slot} = v{slot}.astype(f32)")
            self.widened.add(slot)
        return f"w{slot}"

    def static_shape(self, slot: int) -> tuple[int, ...] | None:
        if slot in self.constants:
            return tuple(np.shape(self.plan.template[slot]))
        return self.shape.get(slot)

    def broadcasts_to(self, slots: tuple[int, ...] | list[int], declared: Any) -> bool:
        """Whether NumPy operations broadcasting ``slots`` (widened) surely make an ndarray of
        the ``declared`` shape: then its class and shape need no check at run time."""
        if not declared:  # unknown, or 0-d: a NumPy scalar may come back
            return False
        shapes = [self.static_shape(slot) for slot in slots]
        known = [shape for shape in shapes if shape is not None]
        if len(known) != len(shapes):
            return False
        try:
            return tuple(np.broadcast_shapes(*known)) == tuple(declared)
        except ValueError:
            return False

    def static_value(self, slot: int, wide: bool) -> Any:
        """A constant parameter's value as the kernel would see it."""
        value = self.plan.template[slot]
        return widen(value) if wide else value

    def emit(self, line: str) -> None:
        self.lines.append("    " + line)
        self.owner[len(self.lines) + 1] = self.step  # +1: the def line comes first

    def plain(self, slot: int) -> str:
        """An operand of the in-place slice update: widened without a shadow look-up."""
        if slot in self.constants:
            return self.bind("c", widen(self.plan.template[slot]))
        return f"widen(v{slot})" if self.dtype.get(slot) in (FP16, None) else f"v{slot}"

    def wide_list(self, slots: tuple[int, ...]) -> str:
        self.names["widen"] = widen
        return "[" + ", ".join(self.plain(slot) for slot in slots) + "]"

    def constant_args(self, step: Step, skip: tuple[str, ...]) -> OpArgs | None:
        """The op's parameters other than ``skip`` as the kernel sees them, if all constant."""
        values: dict[str, Any] = {}
        for name, slot in step.params:
            if name in skip:
                continue
            if slot.__class__ is tuple or slot not in self.constants:
                return None
            values[name] = self.static_value(slot, step.wide)
        return OpArgs(step.op, values, step.shapes)
