"""A built package's linear layers at their stored precision, as PyTorch CPU kernels.

Each ``linear`` whose weight is a constant of the package keeps that weight as stored:

- int8 per output channel (``constexpr_blockwise_shift_scale``, one scale per row) runs on
  ``aten._weight_int8pack_mm`` (1 byte a weight);
- int4 per block along the input axis (block 32, 64, 128 or 256) runs on
  ``aten._weight_int4pack_mm_for_cpu`` (half a byte a weight, packed two to a byte);
- any other compressed weight (LUT palettes, offsets the int4 kernel cannot take, other block
  shapes) stays compressed in its own arrays and is decompressed one block of rows at a time
  per call, so no full fp32 copy is ever kept;
- fp16 weights stay fp16 and run on PyTorch's fp16 CPU GEMM (fp32 accumulation).

Activations are fp32, as in the reference interpreter (:mod:`decodebench.formats.coreml.interpreter`), and
``bytes_read`` is what one call reads of the weight: the number the roofline divides.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from coremltools.converters.mil.mil import types

from decodebench.formats.coreml.ops_constexpr import repeat_blocks
from decodebench.formats.coreml.registry import KERNELS, OpArgs

INT4_GROUPS = (32, 64, 128, 256)
ROWS_PER_BLOCK = 256  # rows widened at a time: large enough to amortise, small enough for cache


class PackedLinear:
    """``y = x @ W.T + b`` with W kept at its stored precision."""

    kind = "base"

    def __init__(self, bias: np.ndarray | None) -> None:
        self.bias = None if bias is None else torch.from_numpy(np.asarray(bias, np.float32))

    @property
    def bytes_read(self) -> int:
        raise NotImplementedError

    def _matmul(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def __call__(self, x: np.ndarray) -> np.ndarray:
        flat = torch.from_numpy(np.ascontiguousarray(x, np.float32)).reshape(-1, x.shape[-1])
        y = self._matmul(flat)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], y.shape[-1]).numpy()


class Int8Linear(PackedLinear):
    kind = "int8"

    def __init__(self, data: np.ndarray, scale: np.ndarray, bias: np.ndarray | None) -> None:
        super().__init__(bias)
        self.weight = torch.from_numpy(np.ascontiguousarray(data, np.int8))
        self.scale = torch.from_numpy(np.asarray(scale, np.float32).reshape(-1)).contiguous()

    @property
    def bytes_read(self) -> int:
        return self.weight.nbytes + self.scale.nbytes

    def _matmul(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten._weight_int8pack_mm(x, self.weight, self.scale)


class Int4Linear(PackedLinear):
    """int4 in [-8, 7] times a per-block scale: ``(q - 8) * scale + 0`` with ``q = data + 8``."""

    kind = "int4"

    def __init__(self, data: np.ndarray, scale: np.ndarray, bias: np.ndarray | None) -> None:
        super().__init__(bias)
        rows, columns = data.shape
        self.group = columns // scale.shape[1]
        unsigned = torch.from_numpy(np.asarray(data, np.int32) + 8)
        self.weight = torch.ops.aten._convert_weight_to_int4pack_for_cpu(unsigned, 1)
        scales = torch.from_numpy(np.asarray(scale, np.float32))  # [rows, groups]
        self.scales_and_zeros = (
            torch.stack([scales, torch.zeros_like(scales)], dim=-1).transpose(0, 1).contiguous()
        )

    @property
    def bytes_read(self) -> int:
        return self.weight.nbytes + self.scales_and_zeros.nbytes

    def _matmul(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten._weight_int4pack_mm_for_cpu(
            x, self.weight, self.group, self.scales_and_zeros
        )


class BlockwiseLinear(PackedLinear):
    """Rows decompressed block by block with the interpreter's own kernel for the op."""

    kind = "blockwise"

    def __init__(self, op: Any, bias: np.ndarray | None, rows: int) -> None:
        super().__init__(bias)
        self.op_type = op.op_type
        self.inputs = {name: np.asarray(var.val) for name, var in op.inputs.items()}
        self.rows = rows

    @property
    def bytes_read(self) -> int:
        return sum(value.nbytes for value in self.inputs.values())

    def _rows(self, start: int, stop: int) -> np.ndarray:
        """The weight's rows ``start:stop``: every per-row operand sliced, then decompressed."""
        sliced = {}
        for name, value in self.inputs.items():
            if value.ndim >= 2 and value.shape[0] == self.rows:
                sliced[name] = value[start:stop]
            elif value.ndim >= 2 and value.shape[0] > 1:  # per-block along rows: expand first
                sliced[name] = repeat_blocks(value, (self.rows, *value.shape[1:]))[start:stop]
            else:
                sliced[name] = value
        dense = KERNELS[self.op_type](OpArgs(_NoShape(), sliced))
        return np.asarray(dense).astype(np.float16).astype(np.float32)

    def _matmul(self, x: torch.Tensor) -> torch.Tensor:
        blocks = [
            x @ torch.from_numpy(self._rows(start, min(start + ROWS_PER_BLOCK, self.rows))).T
            for start in range(0, self.rows, ROWS_PER_BLOCK)
        ]
        return torch.cat(blocks, dim=-1)


class Fp16Linear(PackedLinear):
    kind = "fp16"

    def __init__(self, weight: np.ndarray, bias: np.ndarray | None) -> None:
        super().__init__(bias)
        self.weight = torch.from_numpy(np.ascontiguousarray(weight, np.float16))

    @property
    def bytes_read(self) -> int:
        return self.weight.nbytes

    def _matmul(self, x: torch.Tensor) -> torch.Tensor:
        # The program's activations are fp16 values (widened), so rounding them back is exact;
        # PyTorch's fp16 CPU GEMM accumulates in fp32.
        return torch.nn.functional.linear(x.half(), self.weight).float()


class _NoShape:
    """Stands in for an op when a decompression kernel runs on a slice of its operands."""

    outputs: list[Any] = []


def pack_linear(op: Any) -> PackedLinear | None:
    """The kernel for a ``linear`` op whose weight is a package constant; None otherwise."""
    weight = op.inputs["weight"]
    bias_var = op.inputs.get("bias")
    bias = None if bias_var is None or bias_var.val is None else np.asarray(bias_var.val)
    producer = weight.op
    if producer is None or weight.rank != 2:
        return None
    if producer.op_type == "const":
        return Fp16Linear(np.asarray(weight.val), bias)
    if not producer.op_type.startswith("constexpr_") or any(
        var.val is None for var in producer.inputs.values()
    ):
        return None
    rows = int(weight.shape[0])
    if producer.op_type == "constexpr_blockwise_shift_scale" and "offset" not in producer.inputs:
        data = np.asarray(producer.inputs["data"].val)
        scale = np.asarray(producer.inputs["scale"].val)
        bits = types.builtin_to_string(producer.inputs["data"].dtype)
        if scale.ndim == 2 and scale.shape[0] == rows and data.shape[1] % scale.shape[1] == 0:
            group = data.shape[1] // scale.shape[1]
            if bits == "int4" and group in INT4_GROUPS:
                return Int4Linear(data, scale, bias)
            if bits == "int8" and scale.shape[1] == 1:
                return Int8Linear(data, scale, bias)
    return BlockwiseLinear(producer, bias, rows)
