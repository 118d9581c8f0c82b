"""A plan compiled to one Python function: the per-op dispatch of the step loop removed.

:class:`decodebench.formats.coreml.interpreter.Interpreter` walks its :class:`~decodebench.formats.coreml.plan.Plan`
op by op: for every op of every step it looks up the step's kind, builds a dictionary of its
operands, an :class:`~decodebench.formats.coreml.registry.OpArgs`, parses constant parameters (axes, perms,
slice bounds, epsilons) again, then zips the outputs with their dtypes and shapes. A SmolLM2 step
runs ~2,500 ops, most of them on a few hundred values, so that bookkeeping cost more than the
arithmetic.

Here the plan becomes the source of one function (``exec``'d once per plan): value slots are
local variables, constants are bound once, constant parameters are parsed once, and each op is a
few lines making the SAME NumPy calls on the SAME fp32 operands as its kernel, in the same
order, with every output rounded to its declared dtype at the same place. Nothing numerical
changes (the interpreter's pins hold it bit for bit); what goes is the Python around the calls:

- an fp16 value read by several computing ops is widened once (the same ``astype`` each of them
  made), except a state's storage, which is read through its fp32 shadow as before;
- the non-finite check of an fp16 output that is widened anyway is a sum of squares of the
  widened values (``np.vdot``: one BLAS call; any NaN or infinity makes it non-finite, finite
  fp16 values cannot overflow it), of an fp32 output the same on the output; when the cheap
  check fails, the exact one decides (an fp32 sum of squares can overflow on finite values), and
  the op is named as before: every op is still checked where it was, so an infinity a later op
  would hide (``rsqrt(inf) = 0``) is caught at the op that made it;
- a state's storage checked whole is not scanned again while only finite slices are written into
  it (:func:`decodebench.formats.coreml.shadows.known_finite`);
- reductions with kept dims call NumPy's ufunc reductions without ``np.max``/``np.mean``'s
  wrappers (the same calls underneath), and an output whose class and shape follow from static
  shapes is not checked for them at run time;
- an op failing is named from the line of the generated source it failed on.

Only plain interpreters are compiled: a subclass overriding ``_execute``, and a first run that
still decompresses ``constexpr_*`` weights, walk the plan as before.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from decodebench.formats.coreml import shadows
from decodebench.formats.coreml.compiled_calls import CallWriter
from decodebench.formats.coreml.compiled_slots import operand_slots
from decodebench.formats.coreml.plan import (
    FP16,
    FP32,
    KERNEL,
    READ_STATE,
    READ_STATE_SHARED,
    SLICE_UPDATE_IN_PLACE,
    UPDATE_STATE,
    WRITE_STATE,
    Plan,
    Step,
    all_finite,
)

STORAGE_KINDS = frozenset({READ_STATE_SHARED, SLICE_UPDATE_IN_PLACE, UPDATE_STATE, WRITE_STATE})


@dataclass
class Compiled:
    """The generated function and what the interpreter needs to call it and name its ops."""

    function: Callable[..., tuple[Any, ...]]
    inputs: list[str]  # function input names, in the order the function takes them
    outputs: list[int]  # plan output slots the function returns, in order
    lines: dict[int, Step | None]  # line of the source -> the step it belongs to
    source: str = field(repr=False)
    code: Any = None  # the generated function's code object (to find its frame)


def storage_finite(value: Any) -> bool:
    """Whether a value that may be a state's storage is finite: known so when its shadow says
    so (checked whole, then only finite slices written), else by its fp32 shadow's sum of
    squares when it has one (exactly the widened storage), else as any other value."""
    if shadows.known_finite(value):
        return True
    wide = shadows.shadow(value)
    if wide is not None and math.isfinite(np.vdot(wide, wide)):
        shadows.mark_finite(value)
        return True
    return all_finite(value)


class _Writer(CallWriter):
    """Writes each step of the plan: its call, its results and their checks."""

    def write(self) -> Compiled:
        inputs = list(self.plan.inputs)
        outputs = [slot for _, slot, constant in self.plan.outputs if constant is None]
        for position, step in enumerate(self.plan.steps):
            self.step = step
            self.position = position
            self.write_step(step)
        self.step = None
        returned = ", ".join(self.raw(slot) for slot in outputs)  # a settled constexpr: bound
        self.emit(f"return ({returned}{',' if len(outputs) == 1 else ''})")
        arguments = ", ".join(f"v{self.plan.inputs[name]}" for name in inputs)
        source = f"def step(states, {arguments}):\n" + "\n".join(self.lines) + "\n"
        code = compile(source, "<compiled plan>", "exec")
        namespace = dict(self.names)
        exec(code, namespace)  # noqa: S102 - source generated above from the plan
        function = namespace["step"]
        return Compiled(function, inputs, outputs, self.owner, source, function.__code__)

    def write_step(self, step: Step) -> None:
        kind = step.kind
        self.exact = False
        if kind in STORAGE_KINDS:
            self.storage.update(step.outputs)
        elif kind == KERNEL and not step.wide and step.function is None:
            if any(slot in self.storage for slot in operand_slots(step)):
                self.storage.update(step.outputs)  # a move may hand on the storage itself
        if kind == KERNEL:
            call, single = self.kernel_call(step)
            self.results(step, call, single)
        elif kind in (READ_STATE, READ_STATE_SHARED):
            method = "read_state" if kind == READ_STATE else "read_state_shared"
            bound = self.bind("m", getattr(self.interpreter, f"_compiled_{method}"))
            self.results(step, f"{bound}({self.bind('s', step)}, states)", True)
        elif kind == SLICE_UPDATE_IN_PLACE and self.slice_indexer(step) is not None:
            params = dict(step.params)
            indexer = self.bind("x", self.slice_indexer(step))
            bound = self.bind("m", self.interpreter._compiled_write_slice)
            target, update = self.raw(params["x"]), self.raw(params["update"])
            begin, end = self.plain(params["begin"]), self.plain(params["end"])
            call = f"{bound}({target}, {update}, {indexer}({begin}, {end}))"
            self.results(step, call, True)
        elif kind == SLICE_UPDATE_IN_PLACE:
            params = dict(step.params)
            operands = ", ".join(
                f"{name!r}: {self.wide_list(slot) if slot.__class__ is tuple else self.plain(slot)}"
                for name, slot in step.params
                if name != "x"
            )
            bound = self.bind("m", self.interpreter._compiled_slice_update)
            target, update = self.raw(params["x"]), self.raw(params["update"])
            call = f"{bound}({self.bind('s', step)}, {target}, {update}, {{{operands}}})"
            self.results(step, call, True)
        elif kind in (UPDATE_STATE, WRITE_STATE):
            bound = self.bind("m", self.interpreter._compiled_update_state)
            call = f"{bound}({self.bind('s', step)}, {self.raw(step.value)}, states)"
            if step.outputs:
                self.results(step, call, True)
            else:
                self.emit(call)
        else:  # CONSTEXPR / OVERRIDDEN never reach here (see Interpreter)
            raise AssertionError(f"step kind {kind} is not compiled")
        for slot in step.frees:
            if slot not in self.constants:
                self.emit(f"del v{slot}")
                if slot in self.widened:
                    self.emit(f"del w{slot}")
                    self.widened.discard(slot)

    def kernel_call(self, step: Step) -> tuple[str, bool]:
        """The expression computing a kernel step's result(s), and whether it is one array."""
        self.exact = False
        if step.function is not None:
            function = self.bind("f", step.function)
            operands = ", ".join(self.wide(slot, True) for slot in step.operands)
            self.exact = self.broadcasts_to(step.operands, step.shapes[0])
            return f"{function}({operands})", True
        special = self.special(step)
        if special is not None:
            return special, True
        entries = []
        for name, slot in step.params:
            if slot.__class__ is tuple:
                if step.wide:
                    value = self.wide_list(slot)
                else:
                    value = "[" + ", ".join(self.raw(item) for item in slot) + "]"
            else:
                value = self.wide(slot, False) if step.wide else self.raw(slot)
            entries.append(f"{name!r}: {value}")
        kernel = self.bind("k", step.kernel)
        op, shapes = self.bind("o", step.op), self.bind("h", step.shapes)
        return f"{kernel}(OpArgs({op}, {{{', '.join(entries)}}}, {shapes}))", False

    def results(self, step: Step, call: str, single: bool) -> None:
        """Assign a step's result(s), as the plan's loop does: to ndarrays of the declared
        dtypes, shape-checked, then the non-finite checks."""
        many = len(step.outputs) != 1
        if many or not single:
            self.emit(f"r = {call}")
            self.emit("r = r if isinstance(r, tuple) else (r,)")
            if many:
                names = [f"v{slot}" for slot in step.outputs]
                self.emit(f"{', '.join(names)}{',' if len(names) == 1 else ''} = r")
            else:
                self.emit(f"v{step.outputs[0]}, = r")
        else:
            self.emit(f"v{step.outputs[0]} = {call}")
        exact, self.exact = self.exact and not many and single, False
        for slot, dtype, shape in zip(step.outputs, step.dtypes, step.shapes, strict=True):
            value = f"v{slot}"
            dtype_name = self.bind("d", dtype)
            if not exact:
                self.emit(f"if {value}.__class__ is not nd: {value} = asarray({value})")
            self.emit(
                f"if {value}.dtype is not {dtype_name}: "
                f"{value} = {value}.astype({dtype_name}, copy=False)"
            )
            if shape is not None and not exact:
                self.emit(
                    f"if {value}.shape != {shape!r}: bad_shape({self.bind('s', step)}, {value})"
                )
        if not self.check:
            return
        for slot in step.checks:
            reads = ", ".join(self.raw(item) for item in step.reads)
            comma = "," if len(step.reads) == 1 else ""
            failed = f"non_finite({self.bind('s', step)}, {slot}, v{slot}, ({reads}{comma}))"
            declared = self.dtype.get(slot)
            shape = self.shape.get(slot)
            one = shape is not None and math.prod(shape) == 1 and len(shape) > 0
            if declared == FP16 and self.wide_readers.get(slot) and slot not in self.storage:
                if step.kind not in STORAGE_KINDS:
                    widened = self.wide(slot, True)
                    if one:  # one value: itself (exact in a Python float)
                        self.emit(f"if not isfinite({widened}.item()): {failed}")
                    else:
                        failed = (
                            f"non_finite_wide({self.bind('s', step)}, {slot}, v{slot}, "
                            f"{widened}, ({reads}{comma}))"
                        )
                        self.emit(f"if not isfinite(vdot({widened}, {widened})): {failed}")
                    continue
            if declared == FP32 and one:
                self.emit(f"if not isfinite(v{slot}.item()): {failed}")
                continue
            if declared == FP32:
                self.emit(f"if not isfinite(vdot(v{slot}, v{slot})): {failed}")
                continue
            check = "storage_finite" if slot in self.storage else "all_finite"
            self.names.update(all_finite=all_finite, storage_finite=storage_finite)
            self.emit(f"if not {check}(v{slot}): {failed}")


def compile_function(plan: Plan, interpreter: Any, check: bool) -> Compiled:
    """The plan's steps as one function ``step(states, *inputs) -> outputs``."""
    writer = _Writer(plan, interpreter, check)
    writer.names["bad_shape"] = interpreter._compiled_bad_shape
    writer.names["non_finite"] = interpreter._compiled_non_finite
    writer.names["non_finite_wide"] = interpreter._compiled_non_finite_wide
    return writer.write()


def failed_step(compiled: Compiled, error: BaseException) -> Step | None:
    """The step of the generated function's line an exception was raised from."""
    found = None
    traceback = error.__traceback__
    while traceback is not None:
        if traceback.tb_frame.f_code is compiled.code:
            found = compiled.lines.get(traceback.tb_lineno)
        traceback = traceback.tb_next
    return found
