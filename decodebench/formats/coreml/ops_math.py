"""Elementwise, linear-algebra, normalisation and reduction kernels (written from the MIL spec)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from decodebench.formats.coreml.registry import KERNELS, Kernel, OpArgs, kernel, normalize_axis

# --- elementwise -----------------------------------------------------------------------------

_BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "real_div": np.true_divide,
    "floor_div": np.floor_divide,
    "mod": np.mod,
    "pow": np.power,
    "maximum": np.maximum,
    "minimum": np.minimum,
    "equal": np.equal,
    "not_equal": np.not_equal,
    "greater": np.greater,
    "greater_equal": np.greater_equal,
    "less": np.less,
    "less_equal": np.less_equal,
    "logical_and": np.logical_and,
    "logical_or": np.logical_or,
    "logical_xor": np.logical_xor,
}


def _binary(function: Callable[[Any, Any], Any]) -> Kernel:
    def run(args: OpArgs) -> Any:
        x, y = np.asarray(args["x"]), np.asarray(args["y"])
        if function is np.true_divide and x.dtype.kind in "iu" and y.dtype.kind in "iu":
            return np.floor_divide(x, y)  # integer real_div keeps the integer type
        return function(x, y)

    return run


# op type -> (its kernel, the NumPy function it applies to its operands): the plan calls the
# function directly when an op's operands are floats (decodebench.formats.coreml.plan.elementwise).
ELEMENTWISE: dict[str, tuple[Kernel, Callable[..., Any]]] = {}

for _name, _function in _BINARY.items():
    KERNELS[_name] = _binary(_function)
    ELEMENTWISE[_name] = (KERNELS[_name], _function)


def _erf(x: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf, otypes=[np.float64])(x).astype(x.dtype)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


_UNARY: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "abs": np.abs,
    "ceil": np.ceil,
    "cos": np.cos,
    "erf": _erf,
    "exp": np.exp,
    "exp2": np.exp2,
    "floor": np.floor,
    "logical_not": np.logical_not,
    "relu": lambda x: np.maximum(x, 0),
    "round": np.round,
    "sigmoid": _sigmoid,
    "sign": np.sign,
    "silu": lambda x: x * _sigmoid(x),
    "sin": np.sin,
    "sqrt": np.sqrt,
    "square": np.square,
    "tan": np.tan,
    "tanh": np.tanh,
    "identity": lambda x: x,
}

for _name, _unary in _UNARY.items():
    KERNELS[_name] = (lambda function: lambda args: function(np.asarray(args["x"])))(_unary)
    ELEMENTWISE[_name] = (KERNELS[_name], _unary)


@kernel("rsqrt")
def _rsqrt(args: OpArgs) -> np.ndarray:
    return 1.0 / np.sqrt(args["x"] + args.scalar("epsilon", 1e-12))


@kernel("inverse")
def _inverse(args: OpArgs) -> np.ndarray:
    return 1.0 / (args["x"] + args.scalar("epsilon", 1e-4))


@kernel("log")
def _log(args: OpArgs) -> np.ndarray:
    return np.log(args["x"] + args.scalar("epsilon", 1e-45))


@kernel("clip")
def _clip(args: OpArgs) -> np.ndarray:
    return np.clip(args["x"], args.scalar("alpha"), args.scalar("beta"))


@kernel("gelu")
def _gelu(args: OpArgs) -> np.ndarray:
    x = args["x"]
    mode = args.scalar("mode", "EXACT")
    if mode == "TANH_APPROXIMATION":
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    if mode == "SIGMOID_APPROXIMATION":
        return x * _sigmoid(1.702 * x)
    return 0.5 * x * (1 + _erf(x / math.sqrt(2)))


@kernel("select")
def _select(args: OpArgs) -> np.ndarray:
    return np.where(np.asarray(args["cond"]).astype(bool), args["a"], args["b"])


@kernel("cast")
def _cast(args: OpArgs) -> np.ndarray:
    return np.asarray(args["x"])  # the interpreter rounds to the declared output dtype


# --- linear algebra and normalisation -----------------------------------------------------------


@kernel("linear")
def _linear(args: OpArgs) -> np.ndarray:
    output = np.matmul(args["x"], np.swapaxes(args["weight"], -1, -2))
    bias = args.get("bias")
    return output if bias is None else output + bias


@kernel("matmul")
def _matmul(args: OpArgs) -> np.ndarray:
    x, y = np.asarray(args["x"]), np.asarray(args["y"])
    if args.scalar("transpose_x", False) and x.ndim >= 2:
        x = np.swapaxes(x, -1, -2)
    if args.scalar("transpose_y", False) and y.ndim >= 2:
        y = np.swapaxes(y, -1, -2)
    return np.matmul(x, y)


def softmax(x: np.ndarray, axis: int) -> np.ndarray:
    shifted = x - np.max(x, axis=axis, keepdims=True)
    exponentials = np.exp(shifted)
    return exponentials / np.sum(exponentials, axis=axis, keepdims=True)


@kernel("softmax")
def _softmax(args: OpArgs) -> np.ndarray:
    return softmax(np.asarray(args["x"]), args.scalar("axis", -1))


@kernel("layer_norm")
def _layer_norm(args: OpArgs) -> np.ndarray:
    x = np.asarray(args["x"])
    axes = tuple(args.ints("axes", range(x.ndim)) or [])
    mean = x.mean(axis=axes, keepdims=True)
    variance = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
    output = (x - mean) / np.sqrt(variance + args.scalar("epsilon", 1e-5))
    if args.get("gamma") is not None:
        output = output * args["gamma"]
    if args.get("beta") is not None:
        output = output + args["beta"]
    return output


@kernel("scaled_dot_product_attention")
def _scaled_dot_product_attention(args: OpArgs) -> np.ndarray:
    query, key, value = args["query"], args["key"], args["value"]
    scores = np.matmul(query, np.swapaxes(key, -1, -2)) / math.sqrt(query.shape[-1])
    mask = args.get("attn_mask")
    if mask is not None:
        mask = np.asarray(mask)
        scores = np.where(mask, scores, -np.inf) if mask.dtype == bool else scores + mask
    return np.matmul(softmax(scores, -1), value)


# --- reductions ---------------------------------------------------------------------------------


def _reduction(function: Callable[..., Any]) -> Kernel:
    def run(args: OpArgs) -> np.ndarray:
        x = np.asarray(args["x"])
        axes = args.ints("axes")
        axis = None if axes is None else tuple(normalize_axis(a, x.ndim) for a in axes)
        return function(x, axis=axis, keepdims=bool(args.scalar("keep_dims", False)))

    return run


# op type -> (its kernel, the reduction it applies): decodebench.formats.coreml.compiled calls the
# reduction directly, its axes parsed once.
REDUCTIONS: dict[str, tuple[Kernel, Callable[..., Any]]] = {}
_REDUCE: dict[str, Callable[..., Any]] = {
    "reduce_sum": np.sum,
    "reduce_mean": np.mean,
    "reduce_max": np.max,
    "reduce_min": np.min,
    "reduce_prod": np.prod,
    "reduce_l2_norm": lambda x, **kw: np.sqrt(np.sum(x * x, **kw)),
    "reduce_log_sum_exp": lambda x, **kw: np.log(np.sum(np.exp(x), **kw)),
}
for _name, _reduce in _REDUCE.items():
    KERNELS[_name] = _reduction(_reduce)
    REDUCTIONS[_name] = (KERNELS[_name], _reduce)


def _arg_reduction(function: Callable[..., np.ndarray]) -> Kernel:
    def run(args: OpArgs) -> np.ndarray:
        x = np.asarray(args["x"])
        axis = normalize_axis(args.scalar("axis", -1), x.ndim)
        output = function(x, axis=axis)
        return np.expand_dims(output, axis) if args.scalar("keep_dims", False) else output

    return run


KERNELS["reduce_argmax"] = _arg_reduction(np.argmax)
KERNELS["reduce_argmin"] = _arg_reduction(np.argmin)


@kernel("cumsum")
def _cumsum(args: OpArgs) -> np.ndarray:
    x = np.asarray(args["x"])
    axis = args.scalar("axis", 0)
    if args.scalar("reverse", False):
        x = np.flip(x, axis)
    output = np.cumsum(x, axis=axis)
    if args.scalar("exclusive", False):
        output = output - x
    return np.flip(output, axis) if args.scalar("reverse", False) else output
