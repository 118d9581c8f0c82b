"""Quantize fp16 weights in torch, bit for bit what coremltools' own compression produces.

- :func:`quantize_linear`: symmetric signed integers per output channel (``block`` 0) or per
  block of ``block`` input channels, the numerics of ``ct.optimize.coreml``'s
  ``linear_symmetric`` mode (range ±(2**(bits-1) - 1), fp16 scale). Torch ops a cache-sized
  chunk at a time, in fp32 with fp16 rounding where coremltools rounds: no copy of a whole
  matrix, ~1 s for every EXAONE layer where the numpy path takes a minute.
- :func:`palettize`: a 2**bits-entry look-up table by 1-D k-means. fp16 has only 65,536 values,
  so k-means runs on the histogram of the bit patterns (exact Lloyd iterations on weighted
  points) and the assignment is a 65,536-entry table lookup: linear in the weight count.

Both return numpy arrays ready for the MIL ``constexpr_*`` ops; :func:`dequantize` and
:func:`depalettize` give back the fp16 weights the device computes with (for sensitivity), and
:func:`to_dtype` converts fp16 to bf16 the fast way.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

LLOYD_ITERATIONS = 30


@dataclass(frozen=True)
class LinearQuantized:
    data: np.ndarray  # int8 values in [-(2**(bits-1) - 1), 2**(bits-1) - 1], weight's shape
    scale: np.ndarray  # fp16 [out, blocks] (blocks = 1 per channel)
    bits: int


@dataclass(frozen=True)
class Palettized:
    indices: np.ndarray  # uint8 indices into the table, weight's shape
    lut: np.ndarray  # fp16 [2**bits] (sorted)
    bits: int


def _blocks(weight: torch.Tensor, block: int) -> torch.Tensor:
    out_channels, in_channels = weight.shape
    if block == 0:
        return weight.view(out_channels, 1, in_channels)
    if in_channels % block:
        raise ValueError(f"{in_channels} input channels are not a multiple of block {block}")
    return weight.view(out_channels, in_channels // block, block)


# Elements per step: the fp32 working set (4 MiB) stays in cache, and no whole-matrix temporary is
# allocated (measured on EXAONE's 2048-wide weights: 2x faster than 4M-element steps).
_CHUNK_ELEMENTS = 1 << 20


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Chunked elementwise work runs faster on one thread than on torch's OpenMP team here
    (measured: 0.9 s against 3.5 s per 210M weights on 2 shared cores)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@torch.no_grad()
def quantize_linear(weight: torch.Tensor, bits: int, block: int) -> LinearQuantized:
    """Symmetric per-channel (block 0) or per-block quantization of a [out, in] fp16 weight."""
    grouped, levels, rows = _prepare(weight, bits, block)
    data = torch.empty(grouped.shape, dtype=torch.int8)
    scale = torch.empty((*grouped.shape[:2], 1), dtype=torch.float16)
    with one_thread():
        _quantize_chunks(grouped, scale, rows, levels, data=data)
    return LinearQuantized(
        data=data.view(weight.shape).numpy(),
        scale=scale.view(scale.shape[0], scale.shape[1]).numpy(),
        bits=bits,
    )


@torch.no_grad()
def fake_quantize_linear(
    weight: torch.Tensor, bits: int, block: int, dtype: torch.dtype = torch.float16
) -> torch.Tensor:
    """``dequantize(quantize_linear(weight, bits, block), dtype)`` in one pass over the weight,
    without materializing the integers (what sensitivity needs)."""
    grouped, levels, rows = _prepare(weight, bits, block)
    scale = torch.empty((*grouped.shape[:2], 1), dtype=torch.float16)
    result = torch.empty(grouped.shape, dtype=dtype)
    with one_thread():
        _quantize_chunks(grouped, scale, rows, levels, dequantized=result)
    return result.view(weight.shape)


def _prepare(weight: torch.Tensor, bits: int, block: int) -> tuple[torch.Tensor, int, int]:
    if weight.dtype != torch.float16 or weight.dim() != 2:
        raise ValueError("quantize_linear takes a 2-D fp16 weight")
    return _blocks(weight, block), 2 ** (bits - 1) - 1, max(1, _CHUNK_ELEMENTS // weight.shape[1])


def _quantize_chunks(
    grouped: torch.Tensor,
    scale: torch.Tensor,
    rows: int,
    levels: int,
    data: torch.Tensor | None = None,
    dequantized: torch.Tensor | None = None,
) -> None:
    """The fp16 arithmetic of coremltools, computed in fp32 (CPUs have no fp16 ALUs: torch's
    fp16 kernels widen anyway, and its fp16 ``amax`` over a block is 20x slower). Bit-identical:
    ``amax`` is exact in any precision; the scale is computed in fp16 as before; the quotient is
    rounded to fp16 before ``round`` (fp32 division then fp16 rounding is fp16 division, since
    24 >= 2 * 11 + 2 bits makes the double rounding innocuous). ``dequantized`` receives the
    device's fp16 product ``q * scale`` (exact in fp32, then rounded once to fp16)."""
    buffer = torch.empty((rows, *grouped.shape[1:]), dtype=torch.float32)
    rounded = torch.empty((rows, *grouped.shape[1:]), dtype=torch.float16)
    for start in range(0, grouped.shape[0], rows):
        chunk = grouped[start : start + rows]
        work = buffer[: chunk.shape[0]]
        chunk_scale = scale[start : start + rows]
        work.copy_(chunk).abs_()
        chunk_scale.copy_(torch.amax(work, dim=-1, keepdim=True))
        # The same fp16 operations as coremltools: (max - min) / (qmax - qmin), round(w / s).
        chunk_scale.mul_(2).div_(2 * levels)
        wide_scale = chunk_scale.float()
        torch.div(work.copy_(chunk), wide_scale, out=work)
        work.copy_(rounded[: chunk.shape[0]].copy_(work))
        work.round_().nan_to_num_(0.0).clamp_(-levels, levels)
        if data is not None:
            data[start : start + rows].copy_(work)
        if dequantized is not None:
            work.mul_(wide_scale)
            work.copy_(rounded[: chunk.shape[0]].copy_(work))
            dequantized[start : start + rows].copy_(work)


@torch.no_grad()
def dequantize(quantized: LinearQuantized, dtype: torch.dtype = torch.float16) -> torch.Tensor:
    """The fp16 weights the device computes with (``(data * scale)`` in fp16), as ``dtype``.

    In fp32 per chunk: ``data * scale`` is exact there (at most 8 bits times fp16's 11), so one
    rounding to fp16 gives the device's product; no slow fp16 kernels, no whole-matrix temporary.
    """
    data = torch.from_numpy(quantized.data)
    scale = torch.from_numpy(quantized.scale).float()
    out_channels, blocks = scale.shape
    grouped = data.view(out_channels, blocks, -1)
    result = torch.empty(grouped.shape, dtype=dtype)
    rows = max(1, _CHUNK_ELEMENTS // data.shape[1])
    buffer = torch.empty((rows, *grouped.shape[1:]), dtype=torch.float32)
    rounded = torch.empty((rows, *grouped.shape[1:]), dtype=torch.float16)
    with one_thread():
        for start in range(0, out_channels, rows):
            work = buffer[: min(rows, out_channels - start)]
            torch.mul(grouped[start : start + rows], scale[start : start + rows, :, None], out=work)
            work.copy_(rounded[: work.shape[0]].copy_(work))
            result[start : start + rows].copy_(work)
    return result.view(data.shape)


def to_dtype(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``tensor.to(dtype)``, through fp32 a chunk at a time: torch's direct fp16 -> bf16 copy is
    an order of magnitude slower than fp16 -> fp32 -> bf16 on x86."""
    if tensor.dtype == dtype or dtype == torch.float32 or tensor.dtype == torch.float32:
        return tensor.to(dtype)
    flat = tensor.reshape(-1)
    result = torch.empty(flat.shape, dtype=dtype)
    buffer = torch.empty(min(_CHUNK_ELEMENTS, flat.numel()), dtype=torch.float32)
    with one_thread():
        for start in range(0, flat.numel(), _CHUNK_ELEMENTS):
            work = buffer[: min(_CHUNK_ELEMENTS, flat.numel() - start)]
            result[start : start + work.numel()].copy_(
                work.copy_(flat[start : start + work.numel()])
            )
    return result.view(tensor.shape)


# Above this many weights the histogram is taken on a strided sample (an odd stride, so it does
# not follow rows): the centers move by far less than fp16 resolution, at a tenth of the time.
_HISTOGRAM_SAMPLE_ABOVE = 1 << 24
_HISTOGRAM_STRIDE = 7


def _bit_patterns(weight: torch.Tensor) -> np.ndarray:
    return weight.contiguous().numpy().view(np.uint16)


def _fp16_histogram(weight: torch.Tensor) -> np.ndarray:
    patterns = _bit_patterns(weight).ravel()
    if patterns.size > _HISTOGRAM_SAMPLE_ABOVE:
        patterns = patterns[::_HISTOGRAM_STRIDE]
    return np.bincount(patterns, minlength=65536)


def _all_fp16_values() -> np.ndarray:
    return np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16)


def _weighted_kmeans_1d(values: np.ndarray, counts: np.ndarray, clusters: int) -> np.ndarray:
    """Lloyd's algorithm on sorted weighted points, started at equal-mass quantiles."""
    order = np.argsort(values)
    values, counts = values[order].astype(np.float64), counts[order].astype(np.float64)
    if len(values) <= clusters:
        centers = np.full(clusters, values[-1])
        centers[: len(values)] = values
        return centers
    cumulative = np.cumsum(counts)
    quantiles = (np.arange(clusters) + 0.5) / clusters * cumulative[-1]
    centers = values[np.searchsorted(cumulative, quantiles)]
    for _ in range(LLOYD_ITERATIONS):
        centers = np.unique(centers)
        edges = (centers[1:] + centers[:-1]) / 2
        assignment = np.searchsorted(edges, values)
        mass = np.bincount(assignment, weights=counts, minlength=len(centers))
        total = np.bincount(assignment, weights=counts * values, minlength=len(centers))
        updated = np.where(mass > 0, total / np.maximum(mass, 1e-300), centers)
        if np.allclose(updated, centers, rtol=0, atol=0):
            break
        centers = updated
    padded = np.full(clusters, centers[-1])
    padded[: len(centers)] = np.sort(centers)
    return padded


@torch.no_grad()
def palettize(weight: torch.Tensor, bits: int) -> Palettized:
    """Per-tensor palettization of an fp16 weight to 2**bits values (1-D k-means)."""
    if weight.dtype != torch.float16:
        raise ValueError("palettize takes an fp16 weight")
    histogram = _fp16_histogram(weight)
    present = np.nonzero(histogram)[0]
    values = _all_fp16_values()[present].astype(np.float64)
    finite = np.isfinite(values)
    lut = _weighted_kmeans_1d(values[finite], histogram[present][finite], 2**bits)
    lut16 = lut.astype(np.float16)
    # Nearest table entry for every possible fp16 bit pattern, then one gather per weight.
    table_values = _all_fp16_values().astype(np.float64)
    edges = (lut16[1:].astype(np.float64) + lut16[:-1].astype(np.float64)) / 2
    nearest = np.searchsorted(edges, np.nan_to_num(table_values)).astype(np.uint8)
    indices = nearest[_bit_patterns(weight)]
    return Palettized(indices=indices, lut=lut16, bits=bits)


@torch.no_grad()
def depalettize(palettized: Palettized) -> torch.Tensor:
    lut = torch.from_numpy(palettized.lut)
    return lut[torch.from_numpy(palettized.indices).long()]
