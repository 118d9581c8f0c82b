"""The decoder's building blocks that no variant axis changes: norm, RoPE, gated MLP."""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional

from decodebench.contracts.presets import LongRopeScaling, ModelConfig


class RMSNorm(nn.Module):
    """``weight * x / sqrt(mean(x^2) + eps)``, formulated so fp16 cannot overflow.

    Real checkpoints carry residual streams whose mean of squares passes 10^6 (SmolLM2-135M from
    layer 12 on), far beyond fp16's 65,504, and the Neural Engine computes in fp16. So the
    statistic is taken of ``x / s``, with ``s`` the power of two at or above ``max(max|x|, 1)``:
    every square is at most 1. With ``r = 1 / sqrt(mean((x/s)^2) + (sqrt(eps)/s)^2)`` the
    identity ``x / sqrt(mean(x^2) + eps) = x * (r / s)`` keeps the result exact, eps included
    (``sqrt(eps)/s`` never overflows; it underflows to 0 only where eps is negligible). Dividing
    by a power of two is exact in fp16, so the graph rounds exactly where the plain formulation
    does, and activations within [-1, 1] (``s = 1``) give the same bits as before.
    """

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps
        self.sqrt_eps = math.sqrt(eps)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32 like the reference implementations, so fp16 weights keep fp32 logits
        # comparable; the Core ML fp16 pass drops these casts again, hence the scaling.
        input_dtype = hidden.dtype
        hidden32 = hidden.float()
        peak = hidden32.abs().amax(-1, keepdim=True).clamp_min(1.0)
        scale = torch.exp2(torch.ceil(torch.log2(peak)))
        variance = (hidden32 / scale).pow(2).mean(-1, keepdim=True)
        variance = variance + (self.sqrt_eps / scale).pow(2)
        inverse_rms = torch.rsqrt(variance) / scale
        return self.weight * (hidden32 * inverse_rms).to(input_dtype)


def rotate_half(x: torch.Tensor, half: int) -> torch.Tensor:
    # `half` is a Python int on purpose: `x.shape[-1] // 2` would trace into shape arithmetic.
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Rotary:
    """RoPE of a query or key [1, H, C, D] with the position's cos and sin [1, 1, C, D]."""

    def __init__(self, head_dim: int) -> None:
        self.half = head_dim // 2

    def __call__(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return x * cos + rotate_half(x, self.half) * sin


class PartialRotary(Rotary):
    """RoPE of the first ``rotary_dim`` dimensions of each head; the rest pass (Phi-3)."""

    def __init__(self, rotary_dim: int) -> None:
        super().__init__(rotary_dim)
        self.rotary_dim = rotary_dim

    def __call__(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        rotated, passed = x[..., : self.rotary_dim], x[..., self.rotary_dim :]
        return torch.cat((super().__call__(rotated, cos, sin), passed), dim=-1)


class NoRotary(Rotary):
    """A layer that attends without positions (SmolLM3's NoPE layers)."""

    def __call__(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return x


def rotary_for(rotates: bool, head_dim: int, rotary_dim: int) -> Rotary:
    if not rotates:
        return NoRotary(head_dim)
    return Rotary(head_dim) if rotary_dim == head_dim else PartialRotary(rotary_dim)


def inverse_frequencies(
    config: ModelConfig, long: bool = False, theta: float | None = None
) -> torch.Tensor:
    """RoPE inverse frequencies of the rotated dimensions in fp64, scaled as the config says
    (Llama 3; LongRoPE's short factors, or its ``long`` ones). ``theta`` names another base
    (Gemma 3's local layers), which is never scaled."""
    dim = config.rotary_dim
    base = config.rope_theta if theta is None else theta
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    scaling = config.rope_scaling
    if scaling is None or theta is not None:
        return inv_freq
    if isinstance(scaling, LongRopeScaling):
        factors = scaling.long_factor if long else scaling.short_factor
        return inv_freq / torch.tensor(factors, dtype=torch.float64)
    # Llama 3: long wavelengths slowed down by `factor`, short ones kept, a smooth blend between.
    old_context = scaling.original_max_position_embeddings
    wavelength = 2 * math.pi / inv_freq
    low_wavelength = old_context / scaling.low_freq_factor
    high_wavelength = old_context / scaling.high_freq_factor
    slowed = inv_freq / scaling.factor
    smooth = (old_context / wavelength - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    blended = (1 - smooth) * slowed + smooth * inv_freq
    scaled = torch.where(wavelength > low_wavelength, slowed, inv_freq)
    medium = (wavelength >= high_wavelength) & (wavelength <= low_wavelength)
    return torch.where(medium, blended, scaled)


def rope_tables(
    config: ModelConfig, context: int, theta: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of every position, [context, rotary_dim], computed in fp64.

    A table lookup instead of ``position * inv_freq`` in the graph: in fp16 the product loses the
    low bits of large positions, the table does not. LongRoPE rotates positions past its original
    context with its long factors (as transformers does for a token decoded there) and scales
    cos and sin by its attention factor.
    """
    positions = torch.arange(context, dtype=torch.float64)[:, None]
    angles = positions * inverse_frequencies(config, theta=theta)[None, :]
    scale = 1.0
    scaling = config.rope_scaling
    if isinstance(scaling, LongRopeScaling) and theta is None:
        beyond = positions >= scaling.original_max_position_embeddings
        angles = torch.where(beyond, positions * inverse_frequencies(config, long=True), angles)
        scale = scaling.attention_factor
    angles = torch.cat((angles, angles), dim=-1)
    return (angles.cos() * scale).float(), (angles.sin() * scale).float()


ACTIVATIONS = {
    "silu": functional.silu,
    "gelu_tanh": lambda x: functional.gelu(x, approximate="tanh"),
}


class MLP(nn.Module):
    def __init__(self, config: ModelConfig, activation: str = "silu") -> None:
        super().__init__()
        self.activation = ACTIVATIONS[activation]
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.activation(self.gate_proj(hidden)) * self.up_proj(hidden))
