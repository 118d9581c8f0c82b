"""The project's kernels for Core AI operations, in numpy: each takes the operation's operand
values (constants included, as Core AI passes shapes and axes as operands) and returns its
results, computed in float32 (int64 for integers); the engine rounds each result to the type
the program declares. A kind without a kernel is refused by name when a program is planned.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from scipy import special

Kernel = Callable[[list[np.ndarray]], np.ndarray]
KERNELS: dict[str, Kernel] = {}
INT_MAX = 2**31 - 1


def kernel(*kinds: str) -> Callable[[Kernel], Kernel]:
    def register(function: Kernel) -> Kernel:
        for kind in kinds:
            KERNELS[kind] = function
        return function

    return register


def _wide(value: np.ndarray) -> np.ndarray:
    if value.dtype.kind == "f":
        return value.astype(np.float32, copy=False)
    if value.dtype.kind in "iu":
        return value.astype(np.int64, copy=False)
    return value


def _axes(value: np.ndarray, rank: int) -> tuple[int, ...]:
    return tuple(int(axis) % rank for axis in np.asarray(value).reshape(-1))


# --- elementwise -------------------------------------------------------------------------------

_UNARY: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "abs": np.abs,
    "exp": np.exp,
    "exp2": np.exp2,
    "log": np.log,
    "sqrt": np.sqrt,
    "rsqrt": lambda x: 1.0 / np.sqrt(x),
    "reciprocal": lambda x: 1.0 / x,
    "tanh": np.tanh,
    "sin": np.sin,
    "cos": np.cos,
    "sigmoid": special.expit,
    "silu": lambda x: x * special.expit(x),
    "gelu": lambda x: 0.5 * x * (1.0 + special.erf(x / np.sqrt(2.0))),
    "erf": special.erf,
    "neg": np.negative,
    "negate": np.negative,
    "floor": np.floor,
    "ceil": np.ceil,
    "round": np.round,
    "sign": np.sign,
    "square": np.square,
    "logical_not": np.logical_not,
    "softplus": lambda x: np.logaddexp(0.0, x),
}
_BINARY: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "divide": lambda x, y: np.divide(x, y) if x.dtype.kind == "f" else np.floor_divide(x, y),
    "floor_divide": np.floor_divide,
    "pow": np.power,
    "maximum": np.maximum,
    "minimum": np.minimum,
    "mod": np.mod,
    "equal": np.equal,
    "not_equal": np.not_equal,
    "less": np.less,
    "less_equal": np.less_equal,
    "greater": np.greater,
    "greater_equal": np.greater_equal,
    "logical_and": np.logical_and,
    "logical_or": np.logical_or,
    "logical_xor": np.logical_xor,
}


def _unary(function: Callable[[np.ndarray], np.ndarray]) -> Kernel:
    def run(values: list[np.ndarray]) -> np.ndarray:
        with np.errstate(all="ignore"):
            return np.asarray(function(_wide(values[0])))

    return run


def _binary(function: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> Kernel:
    def run(values: list[np.ndarray]) -> np.ndarray:
        with np.errstate(all="ignore"):
            return np.asarray(function(_wide(values[0]), _wide(values[1])))

    return run


for _kind, _function in _UNARY.items():
    KERNELS[_kind] = _unary(_function)
for _kind, _function2 in _BINARY.items():
    KERNELS[_kind] = KERNELS[f"broadcasting_{_kind}"] = _binary(_function2)


@kernel("select", "where", "broadcasting_select")
def _select(values: list[np.ndarray]) -> np.ndarray:
    condition, yes, no = values
    return np.where(condition.astype(bool), _wide(yes), _wide(no))


@kernel("clamp", "clip")
def _clamp(values: list[np.ndarray]) -> np.ndarray:
    return np.clip(_wide(values[0]), _wide(values[1]), _wide(values[2]))


@kernel("cast")
def _cast(values: list[np.ndarray]) -> np.ndarray:
    return _wide(values[0])  # the engine rounds to the declared type


# --- matrix products -----------------------------------------------------------------------


@kernel("batch_matmul", "broadcasting_batch_matmul", "matmul")
def _matmul(values: list[np.ndarray]) -> np.ndarray:
    return np.matmul(_wide(values[0]), _wide(values[1]))


# --- reductions ------------------------------------------------------------------------------


def _reduction(function: Callable[..., np.ndarray]) -> Kernel:
    def run(values: list[np.ndarray]) -> np.ndarray:
        data = _wide(values[0])
        axes = _axes(values[1], data.ndim) if len(values) > 1 else tuple(range(data.ndim))
        with np.errstate(all="ignore"):
            return np.asarray(function(data, axis=axes, keepdims=True))

    return run


_REDUCTIONS: dict[str, Callable[..., np.ndarray]] = {
    "reduce_max": np.max,
    "reduce_min": np.min,
    "reduce_sum": np.sum,
    "reduce_mean": np.mean,
    "reduce_product": np.prod,
}
for _kind, _reduce in _REDUCTIONS.items():
    KERNELS[_kind] = _reduction(_reduce)


@kernel("softmax")
def _softmax(values: list[np.ndarray]) -> np.ndarray:
    data = _wide(values[0])
    axis = int(np.asarray(values[1]).reshape(-1)[0]) if len(values) > 1 else -1
    with np.errstate(all="ignore"):
        shifted = np.exp(data - np.max(data, axis=axis, keepdims=True))
        return shifted / np.sum(shifted, axis=axis, keepdims=True)


@kernel("argmax")
def _argmax(values: list[np.ndarray]) -> np.ndarray:
    axis = int(np.asarray(values[1]).reshape(-1)[0])
    return np.expand_dims(np.argmax(values[0], axis=axis), axis)


# --- shapes and data movement ----------------------------------------------------------------


@kernel("reshape")
def _reshape(values: list[np.ndarray]) -> np.ndarray:
    return values[0].reshape(tuple(int(size) for size in values[1].reshape(-1)))


@kernel("transpose")
def _transpose(values: list[np.ndarray]) -> np.ndarray:
    return np.transpose(values[0], tuple(int(axis) for axis in values[1].reshape(-1)))


@kernel("broadcast_in_dims")
def _broadcast_in_dims(values: list[np.ndarray]) -> np.ndarray:
    data, sizes, dims = values
    shape = list(data.shape)
    for size, axis in zip(sizes.reshape(-1), dims.reshape(-1), strict=True):
        shape[int(axis) % len(shape)] = int(size)
    return np.broadcast_to(data, tuple(shape))


@kernel("broadcast_to")
def _broadcast_to(values: list[np.ndarray]) -> np.ndarray:
    return np.broadcast_to(values[0], tuple(int(size) for size in values[1].reshape(-1)))


@kernel("get_shape")
def _get_shape(values: list[np.ndarray]) -> np.ndarray:
    return np.asarray(values[0].shape, dtype=np.int64)


@kernel("slice")
def _slice(values: list[np.ndarray]) -> np.ndarray:
    data, begin, end, stride = values
    index = []
    for axis, size in enumerate(data.shape):
        start, stop = int(begin[axis]), int(end[axis])
        step = int(stride[axis])
        stop = size if stop >= INT_MAX else stop
        index.append(slice(start, stop, step))
    return data[tuple(index)]


@kernel("concat")
def _concat(values: list[np.ndarray]) -> np.ndarray:
    axis = int(np.asarray(values[0]).reshape(-1)[0])
    return np.concatenate([_wide(value) for value in values[1:]], axis=axis)


@kernel("gather_nd")
def _gather_nd(values: list[np.ndarray]) -> np.ndarray:
    data, indices = values
    depth = indices.shape[-1]
    flat = indices.reshape(-1, depth).astype(np.int64)
    picked = data[tuple(flat[:, axis] for axis in range(depth))]
    return picked.reshape(indices.shape[:-1] + data.shape[depth:])


@kernel("gather_along_axis")
def _gather_along_axis(values: list[np.ndarray]) -> np.ndarray:
    data, indices, axis = values
    return np.take_along_axis(
        data, indices.astype(np.int64), axis=int(np.asarray(axis).reshape(-1)[0])
    )


@kernel("gather")
def _gather(values: list[np.ndarray]) -> np.ndarray:
    data, indices, axis = values
    return np.take(data, indices.astype(np.int64), axis=int(np.asarray(axis).reshape(-1)[0]))


# --- dequantization (coreai-opt's compressed weights) ---------------------------------------


def _blocks(value: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """A per-block parameter (``scale``: one value per block of ``shape``) repeated over its
    blocks, to ``shape``."""
    for axis, (size, blocks) in enumerate(zip(shape, value.shape, strict=True)):
        if blocks != size:
            value = np.repeat(value, size // blocks, axis=axis)
    return value


@kernel("blockwise_shift_scale")
def _blockwise_shift_scale(values: list[np.ndarray]) -> np.ndarray:
    """``scale * (data - offset1) + offset2``, each parameter per block of ``data``."""
    data, scale, offset1, offset2 = values
    shape = data.shape
    shifted = (_wide(data) - _blocks(_wide(offset1), shape)).astype(np.float32)
    return shifted * _blocks(_wide(scale), shape) + _blocks(_wide(offset2), shape)


@kernel("lut_to_dense")
def _lut_to_dense(values: list[np.ndarray]) -> np.ndarray:
    """Each index replaced by its entry of the palette of its block (``lut`` is
    ``[blocks..., palette, vector]``); a vector entry widens ``axis``."""
    indices, lut, axis = values
    rank = indices.ndim
    block = tuple(
        size // blocks for size, blocks in zip(indices.shape, lut.shape[:rank], strict=True)
    )
    grid = np.indices(indices.shape, sparse=True)
    where = tuple(position // step for position, step in zip(grid, block, strict=True))
    picked = _wide(lut)[(*where, indices.astype(np.int64))]  # [*indices.shape, vector]
    vector = lut.shape[-1]
    if vector == 1:
        return picked[..., 0]
    along = int(np.asarray(axis).reshape(-1)[0]) % rank
    moved = np.moveaxis(picked, -1, along + 1)
    shape = list(indices.shape)
    shape[along] *= vector
    return moved.reshape(shape)


MATMULS = frozenset({"batch_matmul", "broadcasting_batch_matmul", "matmul"})
# Kinds that only move or select values: their results are values of their inputs, already of
# the declared type, so neither rounded again nor checked for non-finite values.
MOVES = frozenset(
    {
        "reshape", "transpose", "broadcast_in_dims", "broadcast_to", "slice", "concat",
        "gather_nd", "gather_along_axis", "gather",
    }
)  # fmt: skip


def sequential_fp16_matmul(values: list[np.ndarray]) -> np.ndarray:
    """An fp16 matrix product as Apple's runtime on Linux computes it: along the inner axis in
    order, each product rounded to fp16 and each partial sum rounded to fp16. Exact to the bit
    against that runtime, and one numpy pass per inner index: the arbiter's kernel, not the
    engine's."""
    left, right = (value.astype(np.float32) for value in values)
    if left.ndim == 1:
        left = left[None, :]
    if right.ndim == 1:
        right = right[:, None]
    total = np.zeros(np.matmul(left[..., :1], right[..., :1, :]).shape, dtype=np.float32)
    for inner in range(left.shape[-1]):
        product = left[..., inner : inner + 1] * right[..., inner : inner + 1, :]
        product = product.astype(np.float16).astype(np.float32)
        total = (total + product).astype(np.float16).astype(np.float32)
    return total
