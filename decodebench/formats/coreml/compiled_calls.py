"""The kernel calls the compiled plan writes out itself, their constant parameters parsed once.

Most kernel steps are compiled to a call of the kernel with an
:class:`~decodebench.formats.coreml.registry.OpArgs`, as the interpreter makes it. For the ops a
decode step runs most (``linear``, ``matmul``, ``concat``, reductions, ``softmax``, ``rsqrt``,
the moves) whose parameters other than the data are constant, :class:`CallWriter` writes the
NumPy calls that kernel would make, in the same order on the same operands, so nothing
numerical changes; it also sets ``exact`` when the call surely makes an ndarray of the declared
shape. Anything it does not recognise is left (``None``) to the generic kernel call.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from decodebench.formats.coreml.compiled_slots import SlotWriter
from decodebench.formats.coreml.ops_math import REDUCTIONS, softmax
from decodebench.formats.coreml.ops_tensor import slices
from decodebench.formats.coreml.plan import FP16, FP32, Step
from decodebench.formats.coreml.registry import KERNELS, OpArgs, normalize_axis

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


class CallWriter(SlotWriter):
    """Writes the specialised calls of kernel steps (see the module docstring)."""

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
            return self.linear(step, x, params)
        if op_type == "matmul":
            return self.matmul(step, x, shape, params)
        if x in self.constants:
            return None
        args = self.constant_args(step, ("x",))
        if args is None:
            return None
        if op_type in ("rsqrt", "inverse", "log"):
            return self.with_epsilon(step, x, args)
        if op_type in REDUCTIONS and KERNELS[op_type] is REDUCTIONS[op_type][0]:
            return None if shape is None else self.reduction(step, x, shape, args)
        if op_type == "softmax":
            self.names["softmax"] = softmax
            along = self.bind("a", args.scalar("axis", -1))
            self.exact = self.broadcasts_to([x], step.shapes[0])
            return f"softmax(asarray({self.wide(x, False)}), {along})"
        if step.wide:
            return None
        return self.move(step, x, shape, args)

    def linear(self, step: Step, x: int, params: dict[str, Any]) -> str | None:
        """``linear`` by a constant fp32 weight: a matmul by the weight transposed once."""
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

    def matmul(
        self, step: Step, x: int, shape: tuple[int, ...] | None, params: dict[str, Any]
    ) -> str | None:
        """``matmul`` of computed ``x`` with its transposes decided once."""
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

    def with_epsilon(self, step: Step, x: int, args: OpArgs) -> str:
        """``rsqrt``, ``inverse`` and ``log``, their epsilon bound once."""
        op_type = step.op.op_type
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

    def reduction(self, step: Step, x: int, shape: tuple[int, ...], args: OpArgs) -> str:
        """A reduction, its axes normalised once (a float one with dims kept: the ufunc)."""
        op_type = step.op.op_type
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
            expected = tuple(1 if index in reduced else size for index, size in enumerate(shape))
            self.exact = expected == step.shapes[0]
            reduce = self.bind("f", direct)
            call = f"{reduce}({operand}, {axis!r}, None, None, True)"
            if op_type != "reduce_mean":
                return call
            count = math.prod([shape[index] for index in reduced])
            self.names["mean_of"] = mean_of
            return f"mean_of({call}, {self.bind('n', np.intp(count))})"
        return f"{function}(asarray({operand}), axis={axis!r}, keepdims={keep})"

    def move(self, step: Step, x: int, shape: tuple[int, ...] | None, args: OpArgs) -> str | None:
        """The moves (``reshape``, ``transpose``, ``slice_by_index``): operands as they are."""
        op_type = step.op.op_type
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
