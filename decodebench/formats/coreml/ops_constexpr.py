"""Weight decompression kernels: ``constexpr_*`` ops of iOS 16 and iOS 18 (written from the spec)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from decodebench.formats.coreml.registry import OpArgs, kernel, normalize_axis

# --- weight decompression (constexpr_*) ----------------------------------------------------------


def repeat_blocks(values: np.ndarray, shape: Sequence[int]) -> np.ndarray:
    """Expand per-block parameters to the full tensor shape (block size = dim // blocks)."""
    for axis, (size, blocks) in enumerate(zip(shape, values.shape, strict=True)):
        if blocks != size:
            values = np.repeat(values, size // blocks, axis=axis)
    return values


@kernel("constexpr_blockwise_shift_scale")
def _constexpr_blockwise_shift_scale(args: OpArgs) -> np.ndarray:
    data = np.asarray(args["data"]).astype(np.float32)
    scale = repeat_blocks(np.asarray(args["scale"]).astype(np.float32), data.shape)
    offset = args.get("offset")
    if offset is not None:
        data = data - repeat_blocks(np.asarray(offset).astype(np.float32), data.shape)
    return scale * data


@kernel("constexpr_affine_dequantize")
def _constexpr_affine_dequantize(args: OpArgs) -> np.ndarray:
    data = np.asarray(args["quantized_data"]).astype(np.float32)
    axis = normalize_axis(args.scalar("axis"), data.ndim)

    def along_axis(value: Any) -> np.ndarray:
        array = np.asarray(value).astype(np.float32)
        if array.ndim == 0:
            return array
        shape = [1] * data.ndim
        shape[axis] = array.size
        return array.reshape(shape)

    return along_axis(args["scale"]) * (data - along_axis(args["zero_point"]))


def unpack_bits(packed: np.ndarray, bits: int, count: int) -> np.ndarray:
    """LSB-first bit fields of ``bits`` bits each (the iOS 16 LUT index packing)."""
    stream = np.unpackbits(np.asarray(packed, dtype=np.uint8), bitorder="little")
    fields = stream[: count * bits].reshape(count, bits).astype(np.uint32)
    return (fields << np.arange(bits, dtype=np.uint32)).sum(axis=1)


@kernel("constexpr_lut_to_dense")
def _constexpr_lut_to_dense(args: OpArgs) -> np.ndarray:
    lut = np.asarray(args["lut"])
    if args.get("shape") is not None:  # iOS 16: one flat LUT, indices packed into bytes
        shape = args.ints("shape") or []
        bits = int(math.log2(lut.size))
        return lut[unpack_bits(args["indices"], bits, math.prod(shape))].reshape(shape)
    # iOS 18: lut [*blocks, palettes, vector]; indices hold one palette entry per element.
    indices = np.asarray(args["indices"]).astype(np.int64)
    rank = indices.ndim
    block_counts = lut.shape[:rank]
    block_index = tuple(
        (np.arange(size) // (size // blocks)).reshape([-1 if a == axis else 1 for a in range(rank)])
        for axis, (size, blocks) in enumerate(zip(indices.shape, block_counts, strict=True))
    )
    picked = lut[(*block_index, indices)]  # [*indices.shape, vector]
    vector = lut.shape[-1]
    if vector == 1:
        return picked[..., 0]
    axis = normalize_axis(args.scalar("vector_axis"), rank)
    picked = np.moveaxis(picked, -1, axis + 1)  # [..., n, vector, ...] -> merge into axis
    shape = list(indices.shape)
    shape[axis] *= vector
    return picked.reshape(shape)


@kernel("constexpr_cast")
def _constexpr_cast(args: OpArgs) -> np.ndarray:
    return np.asarray(args["source_val"])


@kernel("constexpr_sparse_to_dense")
def _constexpr_sparse_to_dense(args: OpArgs) -> np.ndarray:
    nonzero = np.asarray(args["nonzero_data"])
    mask = np.asarray(args["mask"]).astype(bool)
    if args.get("shape") is not None:  # iOS 16: a packed bit mask and an explicit shape
        shape = args.ints("shape") or []
        mask = unpack_bits(args["mask"], 1, math.prod(shape)).astype(bool).reshape(shape)
    dense = np.zeros(mask.shape, dtype=nonzero.dtype)
    dense[mask] = nonzero
    return dense
