"""A NumPy reference interpreter for Core ML ML programs (pymil ``Program``).

Numerics: every op computes in fp32 (fp16 inputs are widened) and its outputs are rounded to
the dtype the program declares. So an fp16 program rounds every intermediate tensor to fp16,
as the device does, while accumulations inside one op (matmul, softmax, reductions) run in
fp32, as the Neural Engine and GPU do. Results are therefore close to, not bit-equal with, a
device; they are deterministic, which is what comparing two programs needs.

States (``read_state`` / ``coreml_update_state``) live in a dict the caller owns, so a decode
loop keeps its KV cache between calls exactly like ``MLState``.

Non-finite values: by default every op's output is checked, and the first op that makes a NaN,
or an infinity from finite inputs (an fp16 overflow), raises :class:`NonFiniteError` naming it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from coremltools.converters.mil.mil import Program, types
from numpy.typing import ArrayLike

from decodebench.formats.coreml import shadows
from decodebench.formats.coreml.blas import blas_threads
from decodebench.formats.coreml.compiled import Compiled, compile_function, failed_step
from decodebench.formats.coreml.interpreter_types import (
    InterpreterError,
    TensorSpec,
    UnsupportedOpError,
    made_non_finite,
    numpy_dtype,
    op_location,
)
from decodebench.formats.coreml.interpreter_types import (
    NonFiniteError as NonFiniteError,  # callers import it from here
)
from decodebench.formats.coreml.interpreter_walk import OpWalk
from decodebench.formats.coreml.ops import KERNELS, OpArgs
from decodebench.formats.coreml.ops_tensor import slices
from decodebench.formats.coreml.plan import (
    CONSTEXPR,
    FP16,
    KERNEL,
    OVERRIDDEN,
    READ_STATE,
    READ_STATE_SHARED,
    SLICE_UPDATE_IN_PLACE,
    UPDATE_STATE,
    Plan,
    SlotEnv,
    Step,
    all_finite,
    compile_plan,
    settle_constexpr,
    widen,
)
from decodebench.formats.coreml.plan import input_vars as _input_vars
from decodebench.formats.coreml.plan import static_shape as _static_shape
from decodebench.formats.coreml.program import MilError

STATE_OPS = frozenset({"read_state", "coreml_update_state", "write_state"})


class Interpreter(OpWalk):
    """Runs one function of a program; construct once, call :meth:`run` for every step."""

    # OpenBLAS threads during a step (decodebench.formats.coreml.blas); None leaves the process's setting.
    blas_threads: int | None = 1
    # Run the plan as one generated function (decodebench.formats.coreml.compiled); False walks it op by op.
    compile_steps: bool = True

    def __init__(self, program: Program, function: str = "main", check_finite: bool = True) -> None:
        if function not in program.functions:
            known = ", ".join(sorted(program.functions))
            raise MilError(f"the program has no function {function!r} (it has {known})")
        self.function_name = function
        # Masks legitimately hold -inf and ops pass it on (softmax turns it into 0), so what is
        # flagged is an op that *makes* a NaN, or an infinity from finite inputs: an overflow.
        self.check_finite = check_finite
        self._function = program.functions[function]
        self._operations = list(self._function.operations)
        self.inputs: dict[str, TensorSpec] = {}
        self.states: dict[str, TensorSpec] = {}
        self._state_names: dict[int, str] = {}
        for name, var in self._function.inputs.items():
            if types.is_state(var.sym_type):
                wrapped = var.sym_type.wrapped_type()
                shape = tuple(int(size) for size in wrapped.get_shape())
                self.states[name] = TensorSpec(name, shape, numpy_dtype(wrapped.get_primitive()))
                self._state_names[id(var)] = name
            else:
                self.inputs[name] = TensorSpec(
                    name, _static_shape(var) or (), numpy_dtype(var.dtype)
                )
        self.outputs: list[TensorSpec] = [
            TensorSpec(var.name, _static_shape(var) or (), numpy_dtype(var.dtype))
            for var in self._function.outputs
        ]
        self._check_supported()
        self._last_use = self._last_uses()
        self._constexpr_cache: dict[int, tuple[np.ndarray, ...]] = {}
        self._wide_constants: dict[int, np.ndarray] = {}
        self._wide_bytes = 0
        self._plan: Plan | None = None  # compiled at the first run (subclasses may drop ops)
        self._compiled: dict[bool, Compiled] = {}  # by check_finite

    @property
    def function(self) -> Any:
        """The pymil function this interpreter runs (for reading its dataflow)."""
        return self._function

    def _check_supported(self) -> None:
        for index, op in enumerate(self._operations):
            supported = op.op_type == "const" or op.op_type in STATE_OPS or op.op_type in KERNELS
            if op.blocks:
                supported = False
            if not supported:
                raise UnsupportedOpError(
                    f"unsupported op '{op.op_type}' at {op_location(op, index, self.function_name)}"
                )

    def _last_uses(self) -> dict[int, int]:
        """Index of the last op reading each value, so intermediates are freed early."""
        last: dict[int, int] = {}
        for index, op in enumerate(self._operations):
            for var in _input_vars(op):
                last[id(var)] = index
        for var in self._function.outputs:
            last[id(var)] = len(self._operations)
        return last

    def new_states(self) -> dict[str, np.ndarray]:
        """Zero-filled storage for every state (a fresh KV cache)."""
        return {name: np.zeros(spec.shape, spec.dtype) for name, spec in self.states.items()}

    def run(
        self,
        inputs: Mapping[str, ArrayLike],
        states: dict[str, np.ndarray] | None = None,
    ) -> dict[str, np.ndarray]:
        """Execute the function once; ``states`` is updated in place (fresh zeros if omitted)."""
        states = self.new_states() if states is None else states
        missing_states = sorted(set(self.states) - set(states))
        if missing_states:
            raise MilError(f"no storage for states: {', '.join(missing_states)}")
        plan = self._plan
        if plan is None:
            overridden = type(self)._execute is not Interpreter._execute
            plan = compile_plan(
                self._operations, self._function, self._state_names, numpy_dtype, overridden
            )
            self._plan = plan
        values = list(plan.template)
        for name, slot in plan.inputs.items():
            if name in self.inputs:
                values[slot] = self._checked_input(name, inputs)
        unknown = sorted(set(inputs) - set(self.inputs))
        if unknown:
            raise MilError(f"the program has no inputs named {', '.join(unknown)}")
        compiled = self._compiled_plan(plan)
        if compiled is not None:
            with blas_threads(self.blas_threads):
                returned = self._run_compiled(compiled, values, plan, states)
            return {
                name: _owned(returned[slot]) if constant is None else constant
                for name, slot, constant in plan.outputs
            }
        with blas_threads(self.blas_threads):
            self._run_plan(plan, values, states)
        return {
            name: _owned(values[slot]) if constant is None else constant
            for name, slot, constant in plan.outputs
        }

    def _compiled_plan(self, plan: Plan) -> Compiled | None:
        """The plan as one generated function, once nothing is left for the loop to settle:
        not for a subclass overriding ``_execute``, nor while constexpr weights are pending."""
        if not self.compile_steps:
            return None
        check = bool(self.check_finite)
        found = self._compiled.get(check)
        if found is not None:
            return found
        if any(step.kind in (CONSTEXPR, OVERRIDDEN) for step in plan.steps):
            return None
        self._compiled[check] = found = compile_function(plan, self, check)
        return found

    def _run_compiled(
        self, compiled: Compiled, values: list[Any], plan: Plan, states: dict[str, np.ndarray]
    ) -> dict[int, Any]:
        arguments = [values[plan.inputs[name]] for name in compiled.inputs]
        try:
            with np.errstate(over="ignore"):
                returned = compiled.function(states, *arguments)
        except MilError:
            raise
        except Exception as error:  # a kernel failed: say which op, keep the cause
            step = failed_step(compiled, error)
            if step is None:
                raise
            location = op_location(step.op, step.index, self.function_name)
            raise InterpreterError(f"{location} failed: {error}") from error
        return dict(zip(compiled.outputs, returned, strict=True))

    # --- what the compiled function calls (decodebench.formats.coreml.compiled) -------------------------

    def _compiled_read_state(self, step: Step, states: dict[str, np.ndarray]) -> np.ndarray:
        return states[self._checked_state(step)].copy()

    def _compiled_read_state_shared(self, step: Step, states: dict[str, np.ndarray]) -> Any:
        return self._read_shared(step, states)

    def _compiled_slice_update(
        self, step: Step, target: np.ndarray, update: Any, operands: dict[str, Any]
    ) -> np.ndarray:
        return self._write_slice(step, target, update, operands)

    def _compiled_update_state(self, step: Step, value: Any, states: dict[str, np.ndarray]) -> Any:
        name = self._checked_state(step)
        if value is not states.get(name):  # not already written in place
            states[name] = np.asarray(value).astype(self.states[name].dtype)
        return value

    def _compiled_bad_shape(self, step: Step, value: np.ndarray) -> None:
        raise InterpreterError(
            f"{op_location(step.op, step.index, self.function_name)} produced "
            f"shape {list(value.shape)}, the program declares {list(step.shapes[0] or ())}"
        )

    def _compiled_non_finite(
        self, step: Step, slot: int, array: np.ndarray, reads: tuple[Any, ...]
    ) -> None:
        if all_finite(array):  # the cheap check's false alarm (an fp32 sum of squares overflowed)
            return
        self._raise_non_finite(step, slot, array, reads)

    def _compiled_non_finite_wide(
        self, step: Step, slot: int, array: np.ndarray, wide: np.ndarray, reads: tuple[Any, ...]
    ) -> None:
        """An fp16 output whose widened values' sum of squares is not finite: no false alarm is
        possible (finite fp16 values cannot overflow it), and the NaN test reads the widened
        values (NumPy's fp16 ``isnan`` is 5x slower). Each step of a decoder whose attention
        adds a -inf mask comes here once per layer, to find the infinity passed on."""
        self._raise_non_finite(step, slot, array, reads, bool(np.isnan(wide).any()))

    def _run_plan(self, plan: Plan, values: list[Any], states: dict[str, np.ndarray]) -> None:
        settle = any(step.kind == CONSTEXPR for step in plan.steps)
        check = self.check_finite
        ndarray = np.ndarray
        # An overflow (to fp16 when an output is rounded) is reported by the non-finite check.
        with np.errstate(over="ignore"):
            for step in plan.steps:
                try:
                    results = self._step(step, values, states, plan)
                except MilError:
                    raise
                except Exception as error:  # a kernel failed: say where, keep the cause
                    location = op_location(step.op, step.index, self.function_name)
                    raise InterpreterError(f"{location} failed: {error}") from error
                for slot, dtype, shape, value in zip(
                    step.outputs, step.dtypes, step.shapes, results, strict=True
                ):
                    if value.__class__ is not ndarray:
                        value = np.asarray(value)
                    if value.dtype is not dtype:
                        value = value.astype(dtype, copy=False)
                    if shape is not None and value.shape != shape:
                        raise InterpreterError(
                            f"{op_location(step.op, step.index, self.function_name)} produced "
                            f"shape {list(value.shape)}, the program declares {list(shape)}"
                        )
                    values[slot] = value
                if check:
                    for slot in step.checks:
                        if not all_finite(values[slot]):
                            self._non_finite(step, slot, values)
                for slot in step.frees:
                    values[slot] = None
        if settle:
            settle_constexpr(plan, values)

    def _step(
        self, step: Step, values: list[Any], states: dict[str, np.ndarray], plan: Plan
    ) -> Sequence[Any]:
        kind = step.kind
        if step.function is not None:  # elementwise on floats (plan.elementwise)
            return (step.function(*[np.asarray(widen(values[slot])) for slot in step.operands]),)
        if kind == KERNEL and not step.wide:  # a move: the values as they are
            raw = {
                name: [values[item] for item in slot] if slot.__class__ is tuple else values[slot]
                for name, slot in step.params
            }
            result = step.kernel(OpArgs(step.op, raw, step.shapes))
            return result if isinstance(result, tuple) else (result,)
        if kind == KERNEL or kind == CONSTEXPR:
            operands: dict[str, Any] = {}
            for name, slot in step.params:
                if slot.__class__ is tuple:
                    operands[name] = [widen(values[item]) for item in slot]
                else:
                    value = values[slot]
                    if value.__class__ is np.ndarray and value.dtype == FP16:
                        wide = shadows.shadow(value)  # a KV cache's fp32 copy
                        value = value.astype(np.float32) if wide is None else wide
                    elif value.__class__ is np.float16:
                        value = np.float32(value)
                    operands[name] = value
            result = step.kernel(OpArgs(step.op, operands, step.shapes))
            return result if isinstance(result, tuple) else (result,)
        if kind == READ_STATE:
            return (states[self._checked_state(step)].copy(),)
        if kind == READ_STATE_SHARED:  # its one reader writes the state's storage in place
            return (self._read_shared(step, states),)
        if kind == SLICE_UPDATE_IN_PLACE:
            return (self._slice_update_in_place(step, values),)
        if kind == OVERRIDDEN:
            return self._execute(step.op, SlotEnv(values, plan.slots), states)
        name = self._checked_state(step)
        value = values[step.value]
        if value is not states.get(name):  # not already written in place
            states[name] = np.asarray(value).astype(self.states[name].dtype)
        return (value,) if step.outputs else ()

    def _read_shared(self, step: Step, states: dict[str, np.ndarray]) -> Any:
        name = self._checked_state(step)
        stored, spec = states[name], self.states[name]
        shared = isinstance(stored, np.ndarray) and stored.flags.writeable
        if shared and stored.dtype == step.dtypes[0] == spec.dtype:
            shadows.track(stored)
            return stored
        return stored.copy()  # a state stored otherwise: updated the usual way

    def _slice_update_in_place(self, step: Step, values: list[Any]) -> np.ndarray:
        """``slice_update`` writing into its input (the state's storage, or a private copy)."""
        params = dict(step.params)
        operands = {
            name: [widen(values[item]) for item in slot]
            if slot.__class__ is tuple
            else widen(values[slot])
            for name, slot in step.params
            if name != "x"
        }
        return self._write_slice(step, values[params["x"]], values[params["update"]], operands)

    def _write_slice(
        self, step: Step, target: np.ndarray, update: Any, operands: dict[str, Any]
    ) -> np.ndarray:
        index = slices(OpArgs(step.op, operands, step.shapes), target.shape)
        return self._compiled_write_slice(target, update, index)

    def _compiled_write_slice(self, target: np.ndarray, update: Any, index: Any) -> np.ndarray:
        # (a run's one np.errstate(over="ignore") covers the rounding of an fp32 update)
        target[index] = np.asarray(update).reshape(target[index].shape)
        shadows.write(target, index)
        return target

    def _checked_state(self, step: Step) -> str:
        if not step.state:
            state = step.op.inputs["state" if step.kind == UPDATE_STATE else "input"]
            raise InterpreterError(f"{state.name!r} is not a state of this function")
        return step.state

    def _non_finite(self, step: Step, slot: int, values: list[Any]) -> None:
        self._raise_non_finite(step, slot, values[slot], [values[item] for item in step.reads])

    def _raise_non_finite(
        self,
        step: Step,
        slot: int,
        array: np.ndarray,
        reads: Sequence[Any],
        nan: bool | None = None,
    ) -> None:
        """Raise NonFiniteError unless the infinity was passed on (a -inf mask), not made."""
        error = made_non_finite(step, slot, array, reads, self.function_name, nan)
        if error is not None:
            raise error

    def _checked_input(self, name: str, inputs: Mapping[str, ArrayLike]) -> np.ndarray:
        spec = self.inputs[name]
        if name not in inputs:
            raise MilError(f"missing input {name!r} {list(spec.shape)} {spec.dtype}")
        array = np.asarray(inputs[name])
        if spec.shape and array.shape != spec.shape:
            raise MilError(
                f"input {name!r} has shape {list(array.shape)}, the program expects "
                f"{list(spec.shape)}"
            )
        return array.astype(spec.dtype, copy=False)


def _owned(value: Any) -> Any:
    """An output not sharing memory with a state, its shadow or a constant."""
    if isinstance(value, np.ndarray) and not value.flags.owndata:
        return value.copy()
    return value
