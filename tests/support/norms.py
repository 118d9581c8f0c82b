"""Normalisations written the way models write them, converted to fp16 by coremltools.

Each module takes ``x`` [1, 1, width]; :func:`converted_norm` traces and converts it with the
default passes in fp16 (what drops transformers' fp32 upcast) and returns the pymil program,
ready for the interpreter and for :func:`decodebench.formats.coreml.norm_repair.repair_norms`.
:func:`massive_row` is an input with one massive-activation channel, the kind that makes
``x ** 2`` overflow in fp16.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

WIDTH = 64


class LlamaStyleRmsNorm(nn.Module):
    """transformers' LlamaRMSNorm: fp32 upcast, pow(2).mean, rsqrt, weight."""

    def __init__(self, eps: float = 1e-5) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.linspace(0.5, 1.5, WIDTH))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        wide = x.to(torch.float32)
        variance = wide.pow(2).mean(-1, keepdim=True)
        return self.weight * (wide * torch.rsqrt(variance + self.eps)).to(x.dtype)


class SqrtDivRmsNorm(nn.Module):
    """x * x, then sqrt and a division (how several ports write it)."""

    def __init__(self, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.linspace(1.5, 0.5, WIDTH))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * (x / torch.sqrt((x * x).mean(-1, keepdim=True) + self.eps))


class DecomposedLayerNorm(nn.Module):
    """LayerNorm written out: centre, square, mean, rsqrt, weight and bias."""

    def __init__(self, eps: float = 1e-5) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.linspace(0.5, 1.5, WIDTH))
        self.bias = nn.Parameter(torch.linspace(-0.1, 0.1, WIDTH))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        centred = x - x.mean(-1, keepdim=True)
        variance = centred.pow(2).mean(-1, keepdim=True)
        return self.weight * (centred * torch.rsqrt(variance + self.eps)) + self.bias


class TorchRmsNorm(nn.Module):
    """torch's own rms_norm: coremltools lowers it to its max|x|-rescaled chain."""

    def __init__(self, eps: float = 1e-2) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.linspace(0.5, 1.5, WIDTH))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.rms_norm(x, (WIDTH,), self.weight, self.eps)


def converted_norm(module: nn.Module) -> Any:
    """``module`` traced and converted to an fp16 ML program (pymil)."""
    import coremltools as ct

    from decodebench.formats.coreml import compat

    compat.install()
    example = torch.randn(1, 1, WIDTH)
    traced = compat.trace(module.eval(), (example,))
    return ct.convert(
        traced,
        inputs=[ct.TensorType(name="x", shape=(1, 1, WIDTH), dtype=np.float16)],
        outputs=[ct.TensorType(name="y", dtype=np.float16)],
        convert_to="milinternal",
        minimum_deployment_target=ct.target.iOS18,
        compute_precision=ct.precision.FLOAT16,
    )


def massive_row(peak: float, seed: int = 0) -> np.ndarray:
    """[1, 1, WIDTH] of ordinary activations with one channel at ``peak``."""
    row = np.random.default_rng(seed).normal(0.0, 1.0, (1, 1, WIDTH))
    row[..., 7] = peak
    return row.astype(np.float16)


def reference(module: nn.Module, x: np.ndarray) -> np.ndarray:
    """The module in fp32 on the fp16 input."""
    with torch.no_grad():
        return module(torch.from_numpy(x.astype(np.float32))).numpy()
