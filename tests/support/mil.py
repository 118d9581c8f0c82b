"""Weight decompression checked against coremltools' own."""

from __future__ import annotations

import numpy as np
from coremltools.converters.mil.mil import Program

from decodebench.formats.coreml.interpreter import numpy_dtype
from decodebench.formats.coreml.ops import KERNELS, OpArgs


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


def naive_fp16_norm(width: int) -> Program:
    """An RMSNorm written naively in fp16 (input ``x``, [1, width]): its square, the op named
    ``square_overflows``, reaches infinity once |x| passes 256, and rsqrt hides it (0 after)."""
    from coremltools.converters.mil import Builder as mb
    from coremltools.converters.mil.mil import types

    @mb.program(input_specs=[mb.TensorSpec((1, width), types.fp16)])
    def norm(x):
        squares = mb.pow(x=x, y=np.float16(2.0), name="square_overflows")
        mean = mb.reduce_mean(x=squares, axes=[-1], keep_dims=True)
        scale = mb.rsqrt(x=mb.add(x=mean, y=np.float16(1e-5)))
        return mb.mul(x=x, y=scale, name="normed")

    return norm


def decoder_norm(width: int) -> Program:
    """The decoder's RMSNorm as the converter writes it in fp16 (input ``x``, [1, width]): the
    17-op chain that scales by a power of two (abs, reduce_max, maximum, log, mul, ceil, exp2,
    real_div, pow, ...), with gains from 0.5 to 1.5."""
    import coremltools as ct
    import torch

    from decodebench.formats.coreml.program import quiet_coremltools
    from decodebench.modeling import RMSNorm

    norm = RMSNorm(width, 1e-5).eval()
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(0.5, 1.5, width))
    traced = torch.jit.trace(norm, torch.ones(1, width))
    with quiet_coremltools():
        model = ct.convert(
            traced,
            inputs=[ct.TensorType(name="x", shape=(1, width), dtype=np.float16)],
            minimum_deployment_target=ct.target.iOS18,
            compute_precision=ct.precision.FLOAT16,
            skip_model_load=True,
        )
    return model._mil_program
