"""A program's own fp32 reference: the same program with every fp16 value declared fp32.

The reference interpreter computes every op in fp32 and rounds its outputs to the dtype the
program declares (docs/interpreter.md). :func:`widen_program` re-declares every fp16 value of a
loaded program (op outputs, function inputs, states, the ``dtype`` of casts) as fp32, in place,
so the interpreter keeps each intermediate in fp32 instead of rounding it to fp16: the package
run in fp32 with its own weights (fp16 weights are exact in fp32; compressed ones decompress to
fp32), which needs no checkpoint.

It is a transform of the in-memory program for running only; a widened program is not saved
(the converter's fp16 passes would have to run again to make it a package).
"""

from __future__ import annotations

from typing import Any

from coremltools.converters.mil.mil import Program, types


def _wide(sym_type: Any) -> Any:
    """``sym_type`` with fp16 replaced by fp32 (tensors, scalars and states); others as they are."""
    if types.is_state(sym_type):
        wrapped = sym_type.wrapped_type()
        return types.state(_wide(wrapped))
    if types.is_tensor(sym_type):
        if sym_type.get_primitive() == types.fp16:
            return types.tensor(types.fp32, sym_type.get_shape())
        return sym_type
    if sym_type == types.fp16:
        return types.fp32
    return sym_type


def widen_program(program: Program) -> int:
    """Declare every fp16 value of ``program`` fp32, in place; returns how many were changed."""
    changed = 0
    for function in program.functions.values():
        for var in function.inputs.values():
            wide = _wide(var.sym_type)
            if wide is not var.sym_type:
                var._sym_type = wide
                changed += 1
        for op in function.operations:
            if op.op_type == "cast" and op.inputs["dtype"].val == "fp16":
                # The kernel keeps its operand; what the output is rounded to is the declared
                # dtype. The parameter is kept consistent with it all the same.
                op.inputs["dtype"]._sym_val.val = "fp32"
            for var in op.outputs:
                wide = _wide(var.sym_type)
                if wide is not var.sym_type:
                    var._sym_type = wide
                    changed += 1
    return changed
