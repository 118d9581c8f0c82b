"""The interpreter's op-by-op path: one pymil op run on the values computed so far.

A plan step is normally run from its slots (:mod:`decodebench.formats.coreml.plan`); a subclass of
:class:`~decodebench.formats.coreml.interpreter.Interpreter` overriding ``_execute`` (the doctor's
peak recorder) gets every op through here instead, with the values by ``id(var)``: state reads
and writes by the state's name, ``constexpr_*`` weights decompressed once, constant fp16 weights
widened once within :data:`~decodebench.formats.coreml.plan.WIDE_CONSTANT_BUDGET`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from decodebench.formats.coreml.interpreter_types import InterpreterError, numpy_dtype
from decodebench.formats.coreml.ops import KERNELS, OpArgs
from decodebench.formats.coreml.plan import WIDE_CONSTANT_BUDGET, widen


class OpWalk:
    """``_execute`` and what it reads with; the interpreter sets the attributes below."""

    states: dict[str, Any]  # state name -> its TensorSpec
    _state_names: dict[int, str]
    _constexpr_cache: dict[int, tuple[np.ndarray, ...]]
    _wide_constants: dict[int, np.ndarray]
    _wide_bytes: int

    def _value(self, var: Any, env: Mapping[int, Any]) -> Any:
        if id(var) in env:
            return env[id(var)]
        if var.op is not None and var.op.op_type == "const":
            return var.val
        raise InterpreterError(f"value {var.name!r} is read before it is computed")

    def _execute(
        self, op: Any, env: Mapping[int, Any], states: dict[str, np.ndarray]
    ) -> Sequence[Any]:
        op_type = op.op_type
        if op_type == "read_state":
            return (states[self._state_name(op.inputs["input"])].copy(),)
        if op_type in ("coreml_update_state", "write_state"):
            state_var = op.inputs["state" if op_type == "coreml_update_state" else "input"]
            value = self._value(
                op.inputs["value" if op_type == "coreml_update_state" else "data"], env
            )
            name = self._state_name(state_var)
            states[name] = np.asarray(value).astype(self.states[name].dtype)
            return (value,) if op.outputs else ()
        if op_type.startswith("constexpr_") and id(op) in self._constexpr_cache:
            return self._constexpr_cache[id(op)]
        values = {
            name: (
                [self._operand(item, env) for item in var]
                if isinstance(var, list | tuple)
                else self._operand(var, env)
            )
            for name, var in op.inputs.items()
        }
        result = KERNELS[op_type](OpArgs(op, values))
        results = tuple(result) if isinstance(result, tuple) else (result,)
        if op_type.startswith("constexpr_"):  # weights: decompress once per interpreter
            outputs = tuple(
                np.asarray(value).astype(numpy_dtype(var.dtype))
                for var, value in zip(op.outputs, results, strict=True)
            )
            self._constexpr_cache[id(op)] = outputs
            return outputs
        return results

    def _operand(self, var: Any, env: Mapping[int, Any]) -> Any:
        """An op's input widened to fp32; constants (weights) are widened once, within a budget."""
        widened = self._wide_constants.get(id(var))
        if widened is not None:
            return widened
        value = widen(self._value(var, env))
        producer = var.op.op_type if var.op is not None else ""
        constant = producer == "const" or producer.startswith("constexpr_")
        if constant and isinstance(value, np.ndarray) and value.dtype == np.float32:
            if self._wide_bytes + value.nbytes <= WIDE_CONSTANT_BUDGET:
                self._wide_constants[id(var)] = value
                self._wide_bytes += value.nbytes
        return value

    def _state_name(self, var: Any) -> str:
        try:
            return self._state_names[id(var)]
        except KeyError:
            raise InterpreterError(f"{var.name!r} is not a state of this function") from None
