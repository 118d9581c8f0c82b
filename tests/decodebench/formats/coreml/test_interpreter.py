"""The MIL reference interpreter on small built programs: op kernels against independent
references (torch, NumPy), fp16 rounding, states, weight decompression against coremltools' own,
and errors. Whole converted programs: tests/decodebench/formats/coreml/test_programs.py."""

from __future__ import annotations

from collections.abc import Callable

import coremltools as ct
import numpy as np
import pytest
import torch
from coremltools.converters.mil import Builder as mb
from coremltools.converters.mil.mil import Program, types
from torch.nn import functional

from decodebench.formats.coreml.interpreter import (
    Interpreter,
    InterpreterError,
    UnsupportedOpError,
)
from decodebench.formats.coreml.program import MilError
from tests.support.mil import decompression_oracles

RNG = np.random.default_rng(0)


def make_program(
    build: Callable[..., object], *arrays: np.ndarray, opset=ct.target.iOS18
) -> Program:
    specs = [
        mb.TensorSpec(shape=array.shape, dtype=types.numpy_type_to_builtin_type(array.dtype))
        for array in arrays
    ]
    return mb.program(input_specs=specs, opset_version=opset)(build)


def run(
    build: Callable[..., object], *arrays: np.ndarray, opset=ct.target.iOS18
) -> list[np.ndarray]:
    program = make_program(build, *arrays, opset=opset)
    names = build.__code__.co_varnames[: build.__code__.co_argcount]
    outputs = Interpreter(program).run(dict(zip(names, arrays, strict=True)))
    return list(outputs.values())


def randn(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def t(array: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(array))


X = randn(2, 3, 4, 5)
Q, K, V = randn(1, 4, 3, 8), randn(1, 4, 6, 8), randn(1, 4, 6, 8)
MASK = np.triu(np.full((3, 6), -np.inf, dtype=np.float32), k=4)[None, None]

CASES: dict[str, tuple[Callable[..., object], tuple[np.ndarray, ...], np.ndarray]] = {
    "softmax": (lambda x: mb.softmax(x=x, axis=1), (X,), functional.softmax(t(X), 1).numpy()),
    "gelu": (lambda x: mb.gelu(x=x), (X,), functional.gelu(t(X)).numpy()),
    "gelu_tanh": (
        lambda x: mb.gelu(x=x, mode="TANH_APPROXIMATION"),
        (X,),
        functional.gelu(t(X), approximate="tanh").numpy(),
    ),
    "silu": (lambda x: mb.silu(x=x), (X,), functional.silu(t(X)).numpy()),
    "rsqrt": (lambda x: mb.rsqrt(x=mb.abs(x=x)), (X,), 1 / np.sqrt(np.abs(X) + 1e-12)),
    "layer_norm": (
        lambda x: mb.layer_norm(x=x, axes=[-1], epsilon=1e-5),
        (X,),
        functional.layer_norm(t(X), (5,)).numpy(),
    ),
    "matmul_transposed": (
        lambda q, k: mb.matmul(x=q, y=k, transpose_y=True),
        (Q, K),
        Q @ np.swapaxes(K, -1, -2),
    ),
    "linear": (
        lambda x: mb.linear(
            x=x, weight=np.arange(15, dtype=np.float32).reshape(3, 5), bias=[1.0, 2.0, 3.0]
        ),
        (X,),
        functional.linear(
            t(X), torch.arange(15.0).reshape(3, 5), torch.tensor([1.0, 2, 3])
        ).numpy(),
    ),
    "sdpa": (
        lambda q, k, v, m: mb.scaled_dot_product_attention(query=q, key=k, value=v, attn_mask=m),
        (Q, K, V, MASK),
        functional.scaled_dot_product_attention(t(Q), t(K), t(V), attn_mask=t(MASK)).numpy(),
    ),
    "reduce_max_keep": (
        lambda x: mb.reduce_max(x=x, axes=[-1, 1], keep_dims=True),
        (X,),
        X.max(axis=(1, 3), keepdims=True),
    ),
    "reduce_mean_all": (lambda x: mb.reduce_mean(x=x), (X,), X.mean()),
    "argmax": (lambda x: mb.reduce_argmax(x=x, axis=2), (X,), X.argmax(axis=2)),
    "slice_masks": (
        lambda x: mb.slice_by_index(
            x=x,
            begin=[1, 0, 1, 0],
            end=[2, 3, -1, 5],
            stride=[1, 2, 1, 2],
            begin_mask=[False, True, False, False],
            end_mask=[False, True, False, True],
            squeeze_mask=[True, False, False, False],
        ),
        (X,),
        X[1, ::2, 1:-1, ::2],
    ),
    "slice_by_size": (
        lambda x: mb.slice_by_size(x=x, begin=[0, 1, 0, 2], size=[2, 2, -1, 3]),
        (X,),
        X[:, 1:3, :, 2:5],
    ),
    "slice_update": (
        lambda x: mb.slice_update(
            x=x, update=np.ones((2, 1, 4, 5), np.float32), begin=[0, 1, 0, 0], end=[2, 2, 4, 5]
        ),
        (X,),
        np.concatenate([X[:, :1], np.ones((2, 1, 4, 5), np.float32), X[:, 2:]], axis=1),
    ),
    "concat_interleave": (
        lambda x: mb.concat(values=[x, mb.mul(x=x, y=2.0)], axis=1, interleave=True),
        (X,),
        np.stack([X, 2 * X], axis=2).reshape(2, 6, 4, 5),
    ),
    "split": (
        lambda x: mb.split(x=x, split_sizes=[1, 3], axis=2)[1],
        (X,),
        X[:, :, 1:],
    ),
    "expand_dims_negative": (
        lambda x: mb.expand_dims(x=x, axes=[0, -1]),
        (X,),
        X[None, ..., None],
    ),
    "squeeze": (lambda x: mb.squeeze(x=mb.expand_dims(x=x, axes=[2]), axes=[2]), (X,), X),
    "tile": (lambda x: mb.tile(x=x, reps=[1, 2, 1, 3]), (X,), np.tile(X, (1, 2, 1, 3))),
    "transpose": (lambda x: mb.transpose(x=x, perm=[3, 1, 0, 2]), (X,), X.transpose(3, 1, 0, 2)),
    "gather_batch": (
        lambda x: mb.gather(
            x=x, indices=np.array([[2, 0], [1, 1]], np.int32), axis=1, batch_dims=1
        ),
        (X,),
        np.stack([X[0][[2, 0]], X[1][[1, 1]]]),
    ),
    "gather_along_axis": (
        lambda x: mb.gather_along_axis(x=x, indices=np.zeros((2, 3, 1, 5), np.int32), axis=2),
        (X,),
        X[:, :, :1, :],
    ),
    "select_greater": (
        lambda x: mb.select(cond=mb.greater(x=x, y=0.0), a=x, b=mb.sin(x=x)),
        (X,),
        np.where(X > 0, X, np.sin(X)),
    ),
    "less_equal_cast": (
        lambda x: mb.cast(x=mb.less_equal(x=x, y=0.5), dtype="int32"),
        (X,),
        (X <= 0.5).astype(np.int32),
    ),
    "arith": (
        lambda x: mb.real_div(x=mb.sub(x=mb.pow(x=x, y=2.0), y=mb.cos(x=x)), y=3.0),
        (X,),
        (X**2 - np.cos(X)) / 3.0,
    ),
    "reduce_sum": (lambda x: mb.reduce_sum(x=x, axes=[0]), (X,), X.sum(axis=0)),
    "sigmoid": (lambda x: mb.sigmoid(x=x), (X,), torch.sigmoid(t(X)).numpy()),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_op_matches_reference(case: str) -> None:
    build, arrays, expected = CASES[case]
    (output,) = run(build, *arrays)
    np.testing.assert_allclose(output, expected, rtol=1e-5, atol=1e-5)
    assert output.shape == np.asarray(expected).shape


def test_fp16_program_rounds_every_intermediate() -> None:
    def tiny_steps(dtype: type) -> Callable[..., object]:
        return lambda x: mb.sub(x=mb.add(x=x, y=dtype(1e-4)), y=dtype(1.0))

    one = np.ones((1, 4), np.float32)
    (in_fp32,) = run(tiny_steps(np.float32), one)
    (in_fp16,) = run(tiny_steps(np.float16), one.astype(np.float16))
    # fp32 keeps the 1e-4; fp16 cannot hold 1.0001 (its spacing at 1.0 is ~1e-3), so the add
    # rounds back to 1.0 before the sub sees it.
    np.testing.assert_allclose(in_fp32, 1e-4, rtol=1e-3)
    assert in_fp16.dtype == np.float16
    np.testing.assert_array_equal(in_fp16, np.zeros((1, 4), np.float16))


def test_states_persist_between_runs() -> None:
    @mb.program(
        input_specs=[mb.TensorSpec((1, 3), types.fp16), mb.StateTensorSpec((1, 3), types.fp16)],
        opset_version=ct.target.iOS18,
    )
    def accumulate(x, total):
        updated = mb.add(x=mb.read_state(input=total), y=x)
        return mb.coreml_update_state(state=total, value=updated)

    interpreter = Interpreter(accumulate)
    assert set(interpreter.states) == {"total"} and set(interpreter.inputs) == {"x"}
    states = interpreter.new_states()
    for _ in range(3):
        interpreter.run({"x": np.array([[1, 2, 3]], np.float16)}, states)
    np.testing.assert_array_equal(states["total"], [[3, 6, 9]])


def test_unsupported_op_names_the_op_and_where_it_is() -> None:
    program = make_program(lambda x: mb.relu6(x=mb.add(x=x, y=1.0, name="before")), X)
    with pytest.raises(
        UnsupportedOpError,
        match=r"unsupported op 'relu6' at op #\d+ '\w+' \(relu6 -> \w+\) in function 'main'",
    ):
        Interpreter(program)


def test_bad_inputs_and_failing_ops_are_reported() -> None:
    interpreter = Interpreter(make_program(lambda x: mb.mul(x=x, y=2.0), X))
    with pytest.raises(MilError, match="missing input 'x'"):
        interpreter.run({})
    with pytest.raises(
        MilError, match=r"input 'x' has shape \[1\], the program expects \[2, 3, 4, 5\]"
    ):
        interpreter.run({"x": np.zeros(1, np.float32)})
    with pytest.raises(MilError, match="no inputs named y"):
        interpreter.run({"x": X, "y": X})
    program = make_program(
        lambda x: mb.gather(x=x, indices=np.array([7], np.int32), axis=0, name="oob"), X
    )
    with pytest.raises(InterpreterError, match="op #.* 'oob' .* failed: index 7 is out of bounds"):
        Interpreter(program).run({"x": X})


def test_iOS16_affine_dequantize_and_packed_lut() -> None:
    weight_q = RNG.integers(-128, 127, size=(4, 6), dtype=np.int8)
    indices = RNG.integers(0, 16, size=24)
    packed = np.packbits(
        ((indices[:, None] >> np.arange(4)) & 1).astype(np.uint8).reshape(-1), bitorder="little"
    )

    def build(x):
        affine = mb.constexpr_affine_dequantize(
            quantized_data=weight_q,
            zero_point=np.int8(3),
            scale=np.linspace(0.1, 0.4, 4).astype(np.float32),
            axis=0,
        )
        lut = mb.constexpr_lut_to_dense(
            indices=packed,
            lut=np.linspace(-1, 1, 16).astype(np.float32),
            shape=np.array([4, 6], np.uint32),
        )
        return mb.add(x=mb.linear(x=x, weight=affine), y=mb.linear(x=x, weight=lut))

    x = randn(2, 6)
    program = make_program(build, x, opset=ct.target.iOS16)
    assert decompression_oracles(program) == 2
    (output,) = Interpreter(program).run({"x": x}).values()
    dense_affine = np.linspace(0.1, 0.4, 4)[:, None] * (weight_q.astype(np.float32) - 3)
    dense_lut = np.linspace(-1, 1, 16)[indices].reshape(4, 6)
    np.testing.assert_allclose(output, x @ dense_affine.T + x @ dense_lut.T, rtol=1e-5, atol=1e-5)


def test_iOS18_vector_lut_and_blockwise_offsets() -> None:
    indices = RNG.integers(0, 4, size=(4, 6)).astype(types.np_uint2_dtype)
    lut = RNG.standard_normal((2, 1, 4, 3)).astype(np.float32)  # 2 row blocks, 3-vectors
    data = RNG.integers(0, 16, size=(6, 12)).astype(types.np_uint4_dtype)
    scale = RNG.uniform(0.1, 1.0, size=(3, 6)).astype(np.float32)  # blocks of 2 x 2
    offset = RNG.integers(0, 16, size=(3, 6)).astype(types.np_uint4_dtype)

    def build(x):
        palettized = mb.constexpr_lut_to_dense(indices=indices, lut=lut, vector_axis=0)  # [12, 6]
        shifted = mb.constexpr_blockwise_shift_scale(data=data, scale=scale, offset=offset)
        return mb.linear(x=mb.linear(x=x, weight=palettized), weight=shifted)  # [.., 12] -> [.., 6]

    x = randn(2, 6)
    program = make_program(build, x)
    assert decompression_oracles(program) == 2
    dense_lut = np.concatenate(
        [lut[row // 2, 0][indices[row]].T for row in range(4)], axis=0
    )  # each index expands to 3 consecutive rows
    dense_shift = np.repeat(np.repeat(scale, 2, 0), 2, 1) * (
        data.astype(np.float32) - np.repeat(np.repeat(offset, 2, 0), 2, 1)
    )
    (output,) = Interpreter(program).run({"x": x}).values()
    np.testing.assert_allclose(output, (x @ dense_lut.T) @ dense_shift.T, rtol=1e-4, atol=1e-4)
