"""The plan run as one generated function (decodebench.formats.coreml.compiled) computes the same bits as
the op-by-op loop, and still names the op that fails or overflows, also inside a chain whose
later ops would hide the overflow."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import coremltools as ct
import numpy as np
import pytest
from coremltools.converters.mil import Builder as mb
from coremltools.converters.mil.mil import types

from decodebench.formats.coreml.interpreter import Interpreter, InterpreterError, NonFiniteError
from tests.support.mil import decoder_norm, naive_fp16_norm

RNG = np.random.default_rng(7)
WIDTH = 64
CACHE = (1, 2, 8, 4)


@pytest.fixture(params=[True, False], ids=["compiled", "loop"])
def compiled(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    monkeypatch.setattr(Interpreter, "compile_steps", request.param)
    return bool(request.param)


def ran_compiled(interpreter: Interpreter) -> bool:
    return bool(interpreter._compiled)


@pytest.mark.slow
def test_an_overflow_inside_the_norm_chain_is_named_by_the_op_that_made_it(compiled) -> None:  # noqa: ANN001
    program = decoder_norm(WIDTH)
    interpreter = Interpreter(program)
    ordinary = (RNG.standard_normal((1, WIDTH)) * 300).astype(np.float16)
    output = next(iter(interpreter.run({"x": ordinary}).values()))
    assert ran_compiled(interpreter) == compiled
    # the same bits either way
    other = Interpreter(program)
    other.compile_steps = not compiled
    assert next(iter(other.run({"x": ordinary}).values())).tobytes() == output.tobytes()
    # A peak above 32768 makes the scale 2^16, past fp16: exp2 overflows. The ops after it
    # would turn the infinity into NaN (x / inf, inf / inf) at another op; the check names exp2.
    peaked = ordinary.copy()
    peaked[0, 5] = 40000.0
    with pytest.raises(NonFiniteError, match=r"\(exp2 -> .*an infinity") as caught:
        interpreter.run({"x": peaked})
    assert caught.value.op_type == "exp2"


def test_an_infinity_a_later_op_hides_is_named_where_it_was_made(compiled) -> None:  # noqa: ANN001
    x = np.linspace(-3, 3, WIDTH, dtype=np.float16)[None]
    x[0, 7] = 1000.0  # 1000^2 > 65504; rsqrt(inf) = 0 then zeroes the row silently
    interpreter = Interpreter(naive_fp16_norm(WIDTH))
    with pytest.raises(NonFiniteError, match=r"'square_overflows' \(pow -> ") as caught:
        interpreter.run({"x": x})
    assert (caught.value.op_name, caught.value.op_type) == ("square_overflows", "pow")
    assert ran_compiled(interpreter) == compiled
    unchecked = Interpreter(naive_fp16_norm(WIDTH), check_finite=False).run({"x": x})
    assert not unchecked["normed"].any()


def fp32_scale():
    @mb.program(input_specs=[mb.TensorSpec((1, 4), types.fp32)])
    def scale(x):
        return mb.mul(x=x, y=np.float32(1e20), name="scaled")

    return scale


def test_finite_fp32_values_whose_squares_overflow_are_no_error(compiled) -> None:  # noqa: ANN001
    interpreter = Interpreter(fp32_scale())
    large = interpreter.run({"x": np.ones((1, 4), np.float32)})["scaled"]
    assert np.isfinite(large).all() and float(large[0, 0]) ** 2 > float(np.finfo(np.float32).max)
    with pytest.raises(NonFiniteError, match=r"'scaled' \(mul -> ") as caught:
        interpreter.run({"x": np.full((1, 4), 1e19, np.float32)})
    assert caught.value.op_type == "mul"


def test_a_failing_kernel_is_named(compiled) -> None:  # noqa: ANN001
    @mb.program(input_specs=[mb.TensorSpec((4, 3), types.fp32), mb.TensorSpec((2,), types.int32)])
    def pick(x, rows):
        doubled = mb.mul(x=x, y=np.float32(2.0), name="doubled")
        return mb.gather(x=doubled, indices=rows, axis=0, name="picked")

    interpreter = Interpreter(pick)
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    np.testing.assert_array_equal(
        interpreter.run({"x": x, "rows": np.array([3, 0], np.int32)})["picked"], 2 * x[[3, 0]]
    )
    with pytest.raises(InterpreterError, match=r"op #\d+ 'picked' \(gather -> picked\).* failed"):
        interpreter.run({"x": x, "rows": np.array([9, 0], np.int32)})


def attention_step():
    """A KV cache write then attention over it, as a decode step does (state, in place)."""

    @mb.program(
        input_specs=[
            mb.TensorSpec((1,), types.int32),
            mb.TensorSpec((1, 2, 1, 4), types.fp16),
            mb.StateTensorSpec(CACHE, types.fp16),
        ],
        opset_version=ct.target.iOS18,
    )
    def step(p, row, keys):
        begin = mb.concat(values=[[0, 0], p, [0]], axis=0)
        end = mb.concat(values=[[1, 2], mb.add(x=p, y=1), [4]], axis=0)
        cache = mb.slice_update(x=mb.read_state(input=keys), update=row, begin=begin, end=end)
        written = mb.coreml_update_state(state=keys, value=cache)
        scores = mb.matmul(x=row, y=written, transpose_y=True)
        return mb.softmax(x=mb.mul(x=scores, y=np.float16(0.5)), axis=-1)

    return step


def test_compiled_and_loop_decode_the_same_bits_with_states_in_place() -> None:
    program = attention_step()
    fast, slow = Interpreter(program), Interpreter(program)
    slow.compile_steps = False
    fast_states, slow_states = fast.new_states(), slow.new_states()
    rows = (RNG.standard_normal((CACHE[2], 1, 2, 1, 4)) * 4).astype(np.float16)
    for position, row in enumerate(rows):
        feed = {"p": np.array([position], np.int32), "row": row}
        a, b = fast.run(feed, fast_states), slow.run(feed, slow_states)
        assert [value.tobytes() for value in a.values()] == [
            value.tobytes() for value in b.values()
        ]
        assert fast_states["keys"].tobytes() == slow_states["keys"].tobytes()
    assert ran_compiled(fast) and not ran_compiled(slow)
    assert fast_states["keys"][0, :, 3].tobytes() == rows[3][0, :, 0].tobytes()


def test_a_decompressed_weight_can_be_an_output(compiled) -> None:  # noqa: ANN001
    @mb.program(input_specs=[mb.TensorSpec((2,), types.fp32)], opset_version=ct.target.iOS16)
    def program(x):
        weight = mb.constexpr_affine_dequantize(
            quantized_data=np.array([[1, 2], [3, 4]], np.int8),
            zero_point=np.int8(0),
            scale=np.float32(0.5),
            axis=0,
            name="weight",
        )
        return mb.add(x=x, y=np.float32(1.0), name="shifted"), weight

    interpreter = Interpreter(program)
    first = interpreter.run({"x": np.zeros(2, np.float32)})  # decompresses, op by op
    second = interpreter.run({"x": np.ones(2, np.float32)})  # the weight is a constant now
    assert ran_compiled(interpreter) == compiled
    np.testing.assert_array_equal(first["weight"], [[0.5, 1.0], [1.5, 2.0]])
    assert second["weight"].tobytes() == first["weight"].tobytes()
    np.testing.assert_array_equal(second["shifted"], [2.0, 2.0])


def test_reductions_called_directly_are_numpys_bit_for_bit() -> None:
    """The compiled function calls np.max/np.min/np.sum/np.mean's ufunc reductions without their
    Python wrappers (mean: the sum divided by the count, as NumPy does): the same bits."""
    from decodebench.formats.coreml.compiled_calls import DIRECT_REDUCTIONS, mean_of

    wrapped: dict[str, Callable[..., Any]] = {
        "reduce_max": np.max,
        "reduce_min": np.min,
        "reduce_sum": np.sum,
    }
    rng = np.random.default_rng(5)
    for shape, axes in [((1, 1, 576), (2,)), ((2, 3, 5, 7), (1, 3)), ((3, 1536), (0, 1))]:
        values = (rng.standard_normal(shape) * 300).astype(np.float16).astype(np.float32)
        for op_type, direct in DIRECT_REDUCTIONS.items():
            made = direct(values, axes, None, None, True)
            if op_type == "reduce_mean":
                count = np.intp(np.prod([shape[axis] for axis in axes]))
                made, expected = mean_of(made, count), np.mean(values, axis=axes, keepdims=True)
            else:
                expected = wrapped[op_type](values, axis=axes, keepdims=True)
            assert made.dtype == expected.dtype == np.float32
            assert made.tobytes() == expected.tobytes(), op_type


def reductions_program():
    @mb.program(input_specs=[mb.TensorSpec((2, 3, 40), types.fp16)], opset_version=ct.target.iOS18)
    def reduce(x):
        return (
            mb.reduce_mean(x=x, axes=[2], keep_dims=True),
            mb.reduce_mean(x=x, axes=[0, 2], keep_dims=True),
            mb.reduce_max(x=x, axes=[1], keep_dims=True),
            mb.reduce_min(x=x, axes=[-1], keep_dims=True),
            mb.reduce_sum(x=x, axes=[2], keep_dims=True),
            mb.reduce_mean(x=x, axes=[2], keep_dims=False),
        )

    return reduce


def test_compiled_reductions_give_the_loops_bits() -> None:
    program = reductions_program()
    x = (np.random.default_rng(11).standard_normal((2, 3, 40)) * 300).astype(np.float16)
    compiled, loop = Interpreter(program), Interpreter(program)
    loop.compile_steps = False
    made, expected = compiled.run({"x": x}), loop.run({"x": x})
    assert ran_compiled(compiled) and not ran_compiled(loop)
    assert "mean_of(" in compiled._compiled[True].source  # the direct calls were taken
    for name, value in expected.items():
        assert made[name].dtype == value.dtype == np.float16
        assert made[name].tobytes() == value.tobytes(), name
