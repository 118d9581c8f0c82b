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
from decodebench.formats.coreml.ops_math import REDUCTIONS, softmax
from decodebench.formats.coreml.ops_tensor import slices
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
    widen,
)
from decodebench.formats.coreml.registry import KERNELS, OpArgs, normalize_axis

STORAGE_KINDS = frozenset({READ_STATE_SHARED, SLICE_UPDATE_IN_PLACE, UPDATE_STATE, WRITE_STATE})
# The ufunc reductions np.max, np.min, np.sum and np.mean apply (np.mean: a sum, then divided
# by the count, see mean_of).
DIRECT_REDUCTIONS: dict[str, Callable[..., Any]] = {
    "reduce_max": np.maximum.reduce,
    "reduce_min": np.minimum.reduce,
    "reduce_sum": np.add.reduce,
    "reduce_mean": np.add.reduce,
}


def mean_of(total: np.ndarray, count: np.intp) -> np.ndarray:
    """What ``np.mean`` makes of a float array's sum (an ndarray): the sum divided in place by
    the count as a NumPy integer (the same call, same casting, as ``numpy._core._methods``)."""
    return np.true_divide(total, count, out=total, casting="unsafe", subok=False)


@dataclass
class Compiled:
    """The generated function and what the interpreter needs to call it and name its ops."""

    function: Callable[..., tuple[Any, ...]]
    inputs: list[str]  # function input names, in the order the function takes them
    outputs: list[int]  # plan output slots the function returns, in order
    lines: dict[int, Step | None]  # line of the source -> the step it belongs to
    source: str = field(repr=False)
    code: Any = None  # the generated function's code object (to find its frame)


def wide_shadow(value: Any) -> Any:
    """What a kernel is given for an fp16 value that may be a state's storage."""
    if value.__class__ is np.ndarray and value.dtype == FP16:
        wide = shadows.shadow(value)
        return value.astype(np.float32) if wide is None else wide
    if value.__class__ is np.float16:
        return np.float32(value)
    return value


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


class _Writer:
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
                for slot in _operand_slots(step):
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

    # --- steps ---------------------------------------------------------------------------

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
            if any(slot in self.storage for slot in _operand_slots(step)):
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

    def slice_indexer(self, step: Step) -> Callable[[Any, Any], tuple[Any, ...]] | None:
        """For a slice update whose bounds alone are computed: the index ``slices`` would
        make of them, its constant parameters (stride, masks) parsed once."""
        params = dict(step.params)
        target = params.get("x")
        shape = None if target is None else self.shape.get(target)
        if shape is None or target in self.constants or "begin" not in params:
            return None
        if "end" not in params or {params["begin"], params["end"]} & self.constants:
            return None
        args = self.constant_args(step, ("x", "update", "begin", "end"))
        if args is None:
            return None
        rank = len(shape)
        stride = args.ints("stride", [1] * rank) or []
        begin_mask = [bool(b) for b in args.get("begin_mask", [False] * rank)]
        end_mask = [bool(b) for b in args.get("end_mask", [False] * rank)]
        squeeze_mask = [bool(b) for b in args.get("squeeze_mask", [False] * rank)]

        def index(begin: Any, end: Any) -> tuple[Any, ...]:
            starts = [int(item) for item in np.asarray(begin).ravel().tolist()]
            stops = [int(item) for item in np.asarray(end).ravel().tolist()]
            return tuple(
                starts[axis]
                if squeeze_mask[axis]
                else slice(
                    None if begin_mask[axis] else starts[axis],
                    None if end_mask[axis] else stops[axis],
                    stride[axis],
                )
                for axis in range(rank)
            )

        return index

    def plain(self, slot: int) -> str:
        """An operand of the in-place slice update: widened without a shadow look-up."""
        if slot in self.constants:
            return self.bind("c", widen(self.plan.template[slot]))
        return f"widen(v{slot})" if self.dtype.get(slot) in (FP16, None) else f"v{slot}"

    def wide_list(self, slots: tuple[int, ...]) -> str:
        self.names["widen"] = widen
        return "[" + ", ".join(self.plain(slot) for slot in slots) + "]"

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

    def special(self, step: Step) -> str | None:
        """Kernels whose constant parameters are parsed here once: the call they would make."""
        op_type, params = step.op.op_type, dict(step.params)
        if KERNELS.get(op_type) is not step.kernel:
            return None
        if op_type == "concat" and not step.wide:
            return self.concat(step, params)
        x = params.get("x")
        if x is None or x.__class__ is tuple:
            return None
        shape = self.shape.get(x) if x not in self.constants else None
        if op_type == "linear":
            weight, bias = params.get("weight"), params.get("bias")
            if weight not in self.constants or (bias is not None and bias not in self.constants):
                return None
            value = self.static_value(weight, True)
            if not isinstance(value, np.ndarray) or value.dtype != FP32:
                return None
            transposed = self.bind("t", np.swapaxes(value, -1, -2))
            self.names["matmul"] = np.matmul
            call = f"matmul({self.wide(x, False)}, {transposed})"
            added = None if bias is None else self.static_value(bias, True)
            x_shape = self.static_shape(x)
            if x_shape and len(x_shape) >= 2 and x_shape[-1] == value.shape[-1]:
                product = (*x_shape[:-1], value.shape[0])
                shapes = [product] if added is None else [product, np.shape(added)]
                try:
                    self.exact = tuple(np.broadcast_shapes(*shapes)) == step.shapes[0]
                except ValueError:
                    self.exact = False
            return call if added is None else f"{call} + {self.bind('b', added)}"
        if op_type == "matmul":
            y = params.get("y")
            if y is None or y.__class__ is tuple or x in self.constants:
                return None
            args = self.constant_args(step, ("x", "y"))
            y_shape = self.shape.get(y) if y not in self.constants else None
            if args is None or shape is None:
                return None
            y_rank = np.ndim(self.plan.template[y]) if y in self.constants else None
            y_rank = len(y_shape) if y_shape is not None else y_rank
            if y_rank is None:
                return None
            self.names.update(matmul=np.matmul, swapaxes=np.swapaxes)
            left, right = f"asarray({self.wide(x, False)})", f"asarray({self.wide(y, False)})"
            if args.scalar("transpose_x", False) and len(shape) >= 2:
                left = f"swapaxes({left}, -1, -2)"
            if args.scalar("transpose_y", False) and y_rank >= 2:
                right = f"swapaxes({right}, -1, -2)"
            return f"matmul({left}, {right})"
        if x in self.constants:
            return None
        args = self.constant_args(step, ("x",))
        if args is None:
            return None
        if op_type in ("rsqrt", "inverse", "log"):
            default = {"rsqrt": 1e-12, "inverse": 1e-4, "log": 1e-45}[op_type]
            epsilon = self.bind("e", args.scalar("epsilon", default))
            operand = self.wide(x, False)
            self.exact = self.broadcasts_to([x], step.shapes[0])
            self.names.update(sqrt=np.sqrt, log=np.log)
            if op_type == "rsqrt":
                return f"1.0 / sqrt({operand} + {epsilon})"
            if op_type == "inverse":
                return f"1.0 / ({operand} + {epsilon})"
            return f"log({operand} + {epsilon})"
        if op_type in REDUCTIONS and KERNELS[op_type] is REDUCTIONS[op_type][0]:
            if shape is None:
                return None
            axes = args.ints("axes")
            axis = None if axes is None else tuple(normalize_axis(a, len(shape)) for a in axes)
            function = self.bind("f", REDUCTIONS[op_type][1])
            keep = bool(args.scalar("keep_dims", False))
            operand = self.wide(x, False)
            direct = DIRECT_REDUCTIONS.get(op_type)
            if direct is not None and keep and self.dtype.get(x) in (FP16, FP32):
                # the ufunc reduction np.max / np.sum / np.mean make, without their Python
                # wrappers (a float input, dims kept: the result is an ndarray)
                reduced = tuple(range(len(shape))) if axis is None else axis
                expected = tuple(
                    1 if index in reduced else size for index, size in enumerate(shape)
                )
                self.exact = expected == step.shapes[0]
                reduce = self.bind("f", direct)
                call = f"{reduce}({operand}, {axis!r}, None, None, True)"
                if op_type != "reduce_mean":
                    return call
                count = math.prod([shape[index] for index in reduced])
                self.names["mean_of"] = mean_of
                return f"mean_of({call}, {self.bind('n', np.intp(count))})"
            return f"{function}(asarray({operand}), axis={axis!r}, keepdims={keep})"
        if op_type == "softmax":
            self.names["softmax"] = softmax
            along = self.bind("a", args.scalar("axis", -1))
            self.exact = self.broadcasts_to([x], step.shapes[0])
            return f"softmax(asarray({self.wide(x, False)}), {along})"
        if step.wide:
            return None
        # moves: their operands as they are
        if op_type == "reshape" and step.shapes[0] is not None:
            return f"asarray(v{x}).reshape({step.shapes[0]!r})"
        if op_type == "transpose":
            self.names["transpose"] = np.transpose
            return f"transpose(v{x}, {self.bind('p', args.int_list('perm'))})"
        if op_type == "slice_by_index" and shape is not None:
            return f"asarray(v{x})[{self.bind('i', slices(args, shape))}]"
        return None

    def concat(self, step: Step, params: dict[str, Any]) -> str | None:
        """``concat`` without interleaving, its axis normalised once."""
        values = params.get("values")
        if values.__class__ is not tuple or not values:
            return None
        first = values[0]
        if first in self.constants:
            rank: int | None = np.ndim(np.asarray(self.plan.template[first]))
        else:
            shape = self.shape.get(first)
            rank = None if shape is None else len(shape)
        args = self.constant_args(step, ("values",))
        if rank is None or args is None or args.scalar("interleave", False):
            return None
        axis = int(normalize_axis(args.scalar("axis"), rank))
        self.names["concatenate"] = np.concatenate
        operands = ", ".join(f"asarray({self.raw(slot)})" for slot in values)
        return f"concatenate([{operands}], axis={axis!r})"

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


def _operand_slots(step: Step) -> list[int]:
    found: list[int] = []
    for _, slot in step.params:
        found.extend(slot if slot.__class__ is tuple else (slot,))
    return found


def compile_function(plan: Plan, interpreter: Any, check: bool) -> Compiled:
    """The plan's steps as one function ``step(states, *inputs) -> outputs``."""
    writer = _Writer(plan, interpreter, check)
    writer.names["bad_shape"] = interpreter._compiled_bad_shape
    writer.names["non_finite"] = interpreter._compiled_non_finite
    writer.names["non_finite_wide"] = interpreter._compiled_non_finite_wide
    return writer.write()
