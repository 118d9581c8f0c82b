"""Shape, data-movement, indexing and scatter kernels (written from the MIL spec)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from decodebench.formats.coreml.registry import OpArgs, kernel, normalize_axis

# --- shape and data movement -------------------------------------------------------------------


@kernel("reshape")
def _reshape(args: OpArgs) -> np.ndarray:
    x = np.asarray(args["x"])
    declared = args.output_shape()
    if declared is not None:
        return x.reshape(declared)
    shape = args.ints("shape") or []
    # MIL: 0 copies the input's dimension at that position, -1 is inferred.
    return x.reshape([x.shape[i] if size == 0 else size for i, size in enumerate(shape)])


@kernel("transpose")
def _transpose(args: OpArgs) -> np.ndarray:
    return np.transpose(args["x"], args.int_list("perm"))


@kernel("expand_dims")
def _expand_dims(args: OpArgs) -> np.ndarray:
    x = np.asarray(args["x"])
    rank = x.ndim + len(args.ints("axes") or [])
    for axis in sorted(normalize_axis(a, rank) for a in args.ints("axes") or []):
        x = np.expand_dims(x, axis)
    return x


@kernel("squeeze")
def _squeeze(args: OpArgs) -> np.ndarray:
    x = np.asarray(args["x"])
    axes = args.ints("axes")
    if axes is None:
        return np.squeeze(x)
    return np.squeeze(x, axis=tuple(normalize_axis(a, x.ndim) for a in axes))


@kernel("tile")
def _tile(args: OpArgs) -> np.ndarray:
    return np.tile(args["x"], args.int_list("reps"))


@kernel("concat")
def _concat(args: OpArgs) -> np.ndarray:
    values = [np.asarray(value) for value in args["values"]]
    axis = normalize_axis(args.scalar("axis"), values[0].ndim)
    if args.scalar("interleave", False):
        stacked = np.stack(values, axis=axis + 1)
        shape = list(values[0].shape)
        shape[axis] *= len(values)
        return stacked.reshape(shape)
    return np.concatenate(values, axis=axis)


@kernel("stack")
def _stack(args: OpArgs) -> np.ndarray:
    return np.stack([np.asarray(value) for value in args["values"]], axis=args.scalar("axis"))


@kernel("split")
def _split(args: OpArgs) -> tuple[np.ndarray, ...]:
    x = np.asarray(args["x"])
    axis = normalize_axis(args.scalar("axis"), x.ndim)
    sizes = args.ints("split_sizes")
    if sizes is None:
        count = args.scalar("num_splits")
        sizes = [x.shape[axis] // count] * count
    boundaries = np.cumsum(sizes)[:-1]
    return tuple(np.split(x, boundaries, axis=axis))


def slices(args: OpArgs, shape: Sequence[int]) -> tuple[Any, ...]:
    rank = len(shape)
    begin = args.ints("begin") or []
    end = args.ints("end") or []
    stride = args.ints("stride", [1] * rank) or []
    begin_mask = [bool(b) for b in args.get("begin_mask", [False] * rank)]
    end_mask = [bool(b) for b in args.get("end_mask", [False] * rank)]
    squeeze_mask = [bool(b) for b in args.get("squeeze_mask", [False] * rank)]
    index: list[Any] = []
    for axis in range(rank):
        if squeeze_mask[axis]:
            index.append(begin[axis])
            continue
        start = None if begin_mask[axis] else begin[axis]
        stop = None if end_mask[axis] else end[axis]
        index.append(slice(start, stop, stride[axis]))
    return tuple(index)


@kernel("slice_by_index")
def _slice_by_index(args: OpArgs) -> np.ndarray:
    x = np.asarray(args["x"])
    return x[slices(args, x.shape)]


@kernel("slice_by_size")
def _slice_by_size(args: OpArgs) -> np.ndarray:
    x = np.asarray(args["x"])
    begin = args.ints("begin") or []
    size = args.ints("size") or []
    index = tuple(
        slice(start, None if length == -1 else start + length)
        for start, length in zip(begin, size, strict=True)
    )
    return x[index]


@kernel("slice_update")
def _slice_update(args: OpArgs) -> np.ndarray:
    x = np.array(args["x"], copy=True)
    index = slices(args, x.shape)
    x[index] = np.asarray(args["update"]).reshape(x[index].shape)
    return x


def _take(x: np.ndarray, indices: np.ndarray, axis: int, batch_dims: int) -> np.ndarray:
    if batch_dims == 0:
        return np.take(x, indices, axis=axis)
    return np.stack([_take(x[b], indices[b], axis - 1, batch_dims - 1) for b in range(x.shape[0])])


@kernel("gather")
def _gather(args: OpArgs) -> np.ndarray:
    x = np.asarray(args["x"])
    indices = np.asarray(args["indices"]).astype(np.int64)
    axis = normalize_axis(args.scalar("axis", 0), x.ndim)
    return _take(x, indices, axis, args.scalar("batch_dims", 0))


@kernel("gather_along_axis")
def _gather_along_axis(args: OpArgs) -> np.ndarray:
    x = np.asarray(args["x"])
    indices = np.asarray(args["indices"]).astype(np.int64)
    return np.take_along_axis(x, indices, axis=args.scalar("axis", 0))


@kernel("gather_nd")
def _gather_nd(args: OpArgs) -> np.ndarray:
    x = np.asarray(args["x"])
    indices = np.asarray(args["indices"]).astype(np.int64)
    if args.scalar("batch_dims", 0):
        raise NotImplementedError("gather_nd with batch_dims > 0")
    depth = indices.shape[-1]
    return x[tuple(np.moveaxis(indices, -1, 0))] if depth else x


_SCATTER_MODES: dict[str, Callable[[Any, Any], Any]] = {
    "update": lambda old, new: new,
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": np.true_divide,
    "max": np.maximum,
    "min": np.minimum,
}


@kernel("scatter")
def _scatter(args: OpArgs) -> np.ndarray:
    data = np.array(args["data"], copy=True)
    indices = np.asarray(args["indices"]).astype(np.int64).reshape(-1)
    updates = np.asarray(args["updates"])
    axis = normalize_axis(args.scalar("axis", 0), data.ndim)
    combine = _SCATTER_MODES[args.scalar("mode", "add")]
    moved, moved_updates = np.moveaxis(data, axis, 0), np.moveaxis(updates, axis, 0)
    for position, index in enumerate(indices):
        moved[index] = combine(moved[index], moved_updates[position])
    return data


@kernel("scatter_along_axis")
def _scatter_along_axis(args: OpArgs) -> np.ndarray:
    data = np.array(args["data"], copy=True)
    indices = np.asarray(args["indices"]).astype(np.int64)
    updates = np.asarray(args["updates"])
    axis = normalize_axis(args.scalar("axis", 0), data.ndim)
    combine = _SCATTER_MODES[args.scalar("mode", "add")]
    for position in np.ndindex(*indices.shape):
        target = list(position)
        target[axis] = indices[position]
        data[tuple(target)] = combine(data[tuple(target)], updates[position])
    return data


@kernel("pad")
def _pad(args: OpArgs) -> np.ndarray:
    x = np.asarray(args["x"])
    pad = args.ints("pad") or []
    widths = [(0, 0)] * (x.ndim - len(pad) // 2) + [
        (pad[i], pad[i + 1]) for i in range(0, len(pad), 2)
    ]
    mode = args.scalar("mode", "constant")
    if mode == "constant":
        return np.pad(x, widths, constant_values=args.scalar("constant_val", 0.0))
    numpy_mode: Any = {"reflect": "reflect", "replicate": "edge"}[mode]
    return np.pad(x, widths, mode=numpy_mode)


@kernel("band_part")
def _band_part(args: OpArgs) -> np.ndarray:
    x = np.asarray(args["x"])
    lower, upper = args.scalar("lower", -1), args.scalar("upper", -1)
    rows = np.arange(x.shape[-2])[:, None]
    columns = np.arange(x.shape[-1])[None, :]
    keep = np.ones((x.shape[-2], x.shape[-1]), dtype=bool)
    if lower >= 0:
        keep &= rows - columns <= lower
    if upper >= 0:
        keep &= columns - rows <= upper
    return np.where(keep, x, 0)


@kernel("range_1d")
def _range_1d(args: OpArgs) -> np.ndarray:
    return np.arange(args.scalar("start"), args.scalar("end"), args.scalar("step"))


@kernel("fill")
def _fill(args: OpArgs) -> np.ndarray:
    return np.full(args.int_list("shape"), args.scalar("value", 0.0))


@kernel("shape")
def _shape(args: OpArgs) -> np.ndarray:
    return np.array(np.asarray(args["x"]).shape, dtype=np.int32)


@kernel("one_hot")
def _one_hot(args: OpArgs) -> np.ndarray:
    indices = np.asarray(args["indices"]).astype(np.int64)
    size = args.scalar("one_hot_vector_size")
    axis = args.scalar("axis", -1)
    encoded = np.eye(size)[indices]
    encoded = np.where(encoded > 0, args.scalar("on_value", 1), args.scalar("off_value", 0))
    return np.moveaxis(encoded, -1, axis)
