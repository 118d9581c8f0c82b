"""Weight decompression checked against coremltools' own."""

from __future__ import annotations

import numpy as np
from coremltools.converters.mil.mil import Program

from decodebench.mil.interpreter import numpy_dtype
from decodebench.mil.ops import KERNELS, OpArgs


def decompression_oracles(program: Program) -> int:
    """Each constexpr op through our kernel vs coremltools' own decompression; returns count."""
    checked = 0
    for op in program.functions["main"].operations:
        if not op.op_type.startswith("constexpr_"):
            continue
        ours = KERNELS[op.op_type](OpArgs(op, {name: var.val for name, var in op.inputs.items()}))
        # Rounded to the declared dtype, as the interpreter stores it: bit-equal.
        declared = numpy_dtype(op.outputs[0].dtype)
        np.testing.assert_array_equal(
            np.asarray(ours).astype(declared), op.materialized_val_inference().astype(declared)
        )
        checked += 1
    return checked
