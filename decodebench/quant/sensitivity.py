"""Per-layer quantization sensitivity, measured: KL of next-token distributions against fp16.

For each decoder layer i, only layer i's attention and FFN weights are quantized (with the
recipe's base schemes) and the calibration prompts run through the model; the score is the mean
KL(p_fp16 || p_quantized) over every position. Layers are ranked by it; ``topK`` promotes the
first K.

Done naively that is L full forward passes. Here it is one pass, layer-synchronous: the fp16
hidden states entering each layer are computed once; at layer k the streams perturbed at layers
0..k-1 go through layer k together (one batched matmul, each weight read once) and the stream
perturbed at layer k joins them. The work is the same arithmetic, but weights are read and
widened to fp32 once per layer instead of once per layer per stream, and the lm_head once in all.
The quantized weights computed here are kept in the plan's cache and reused by the artifact.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch.nn import functional

from decodebench.modeling import DecodeStepModel, inverse_frequencies
from decodebench.prompts import builtin_prompts, pseudo_tokenize
from decodebench.quant.apply import QuantPlan, decompress
from decodebench.quant.recipe import QuantRecipe

CALIBRATION_PROMPTS = 2
CALIBRATION_TOKENS = 16
_HEAD_ROWS = 8192


class LayerSensitivity(BaseModel):
    model_config = ConfigDict(frozen=True)

    layer: int
    kl: float = Field(description="Mean KL(fp16 || only this layer quantized), nats per token")


class SensitivityReport(BaseModel):
    """What build.json stores: the ranking and how it was measured."""

    model_config = ConfigDict(frozen=True)

    method: str = "kl_next_token_vs_fp16"
    schemes: dict[str, str] = Field(description="The scheme each layer's weights were tried at")
    calibration: str
    tokens: int
    ranking: list[LayerSensitivity] = Field(description="Most sensitive first")
    promoted: list[int]
    seconds: float = 0.0


def calibration_tokens(
    vocab_size: int, prompts: int = CALIBRATION_PROMPTS, length: int = CALIBRATION_TOKENS
) -> torch.Tensor:
    """[prompts, length] token ids from the built-in prompt set (pseudo-tokenized, repeated to
    length when a prompt is short)."""
    rows = []
    for prompt in builtin_prompts(prompts):
        ids = pseudo_tokenize(prompt.text, vocab_size)
        rows.append((ids * math.ceil(length / len(ids)))[:length])
    return torch.tensor(rows, dtype=torch.long)


def _rms(hidden: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return hidden * torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + eps) * weight.float()


class _Runner:
    """A batched, cache-free, fp32 forward of the decoder's layers (weights widened per layer)."""

    def __init__(self, model: DecodeStepModel, length: int) -> None:
        self.model = model
        self.config = model.config
        angles = (
            torch.arange(length, dtype=torch.float64)[:, None]
            * inverse_frequencies(self.config)[None, :]
        )
        angles = torch.cat((angles, angles), dim=-1)
        self.cos, self.sin = angles.cos().float(), angles.sin().float()

    def layer_weights(
        self, index: int, replace: dict[str, torch.Tensor] | None = None
    ) -> dict[str, torch.Tensor]:
        prefix = f"model.layers.{index}."
        weights = {}
        for name, parameter in self.model.model.layers[index].named_parameters():
            source = (replace or {}).get(prefix + name, parameter)
            weights[name] = source.float()
        return weights

    def layer(self, hidden: torch.Tensor, weights: dict[str, torch.Tensor]) -> torch.Tensor:
        """hidden [S, B, T, H] -> [S, B, T, H]."""
        config = self.config
        streams, batch, length, size = hidden.shape
        flat = hidden.reshape(streams * batch, length, size)
        eps = config.rms_norm_eps
        attention_in = (
            flat if config.post_norm else _rms(flat, weights["input_layernorm.weight"], eps)
        )

        def project(name: str) -> torch.Tensor:
            bias = weights.get(f"self_attn.{name}_proj.bias")
            return functional.linear(attention_in, weights[f"self_attn.{name}_proj.weight"], bias)

        head_dim = config.head_dim
        query = project("q").view(-1, length, config.num_attention_heads, head_dim).transpose(1, 2)
        key = project("k").view(-1, length, config.num_key_value_heads, head_dim).transpose(1, 2)
        value = project("v").view(-1, length, config.num_key_value_heads, head_dim).transpose(1, 2)
        if config.qk_norm:
            query = _rms(query, weights["self_attn.q_norm.weight"], eps)
            key = _rms(key, weights["self_attn.k_norm.weight"], eps)
        half = head_dim // 2

        def rope(x: torch.Tensor) -> torch.Tensor:
            rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
            return x * self.cos + rotated * self.sin

        attended = functional.scaled_dot_product_attention(
            rope(query), rope(key), value, is_causal=True, enable_gqa=True
        )
        attended = attended.transpose(1, 2).reshape(
            -1, length, config.num_attention_heads * head_dim
        )
        attended = functional.linear(attended, weights["self_attn.o_proj.weight"])
        if config.post_norm:
            flat = flat + _rms(attended, weights["post_attention_layernorm.weight"], eps)
            mlp_in = flat
        else:
            flat = flat + attended
            mlp_in = _rms(flat, weights["post_attention_layernorm.weight"], eps)
        gate = functional.linear(mlp_in, weights["mlp.gate_proj.weight"])
        up = functional.linear(mlp_in, weights["mlp.up_proj.weight"])
        mlp_out = functional.linear(functional.silu(gate) * up, weights["mlp.down_proj.weight"])
        if config.post_norm:
            flat = flat + _rms(mlp_out, weights["post_feedforward_layernorm.weight"], eps)
        else:
            flat = flat + mlp_out
        return flat.view(streams, batch, length, size)

    def log_probabilities(self, hidden: torch.Tensor) -> torch.Tensor:
        """[S, B, T, H] -> [S, B*T, vocab] log-softmax, the lm_head widened a block at a time."""
        model = self.model
        normed = _rms(hidden, model.model.norm.weight, self.config.rms_norm_eps)
        rows = normed.reshape(-1, normed.shape[-1])
        head = model.model.embed_tokens.weight if model.lm_head is None else model.lm_head.weight
        logits = torch.empty((rows.shape[0], head.shape[0]), dtype=torch.float32)
        for start in range(0, head.shape[0], _HEAD_ROWS):
            block = head[start : start + _HEAD_ROWS].float()
            torch.matmul(rows, block.T, out=logits[:, start : start + _HEAD_ROWS])
        logits = torch.log_softmax(logits, dim=-1)
        return logits.view(hidden.shape[0], -1, head.shape[0])


@torch.no_grad()
def measure(
    model: DecodeStepModel,
    plan: QuantPlan,
    tokens: torch.Tensor | None = None,
    progress: Callable[[float], None] | None = None,
) -> list[LayerSensitivity]:
    """KL per layer (layer order) with only that layer quantized at the recipe's base schemes."""
    config = model.config
    tokens = calibration_tokens(config.vocab_size) if tokens is None else tokens
    runner = _Runner(model, tokens.shape[1])
    reference = model.model.embed_tokens.weight[tokens].float()[None]  # [1, B, T, H]
    perturbed: torch.Tensor | None = None
    for index in range(config.num_layers):
        weights = runner.layer_weights(index)
        quantized = runner.layer_weights(index, _quantized_layer(model, plan, index))
        stream = runner.layer(reference, quantized)
        if perturbed is not None:
            perturbed = runner.layer(perturbed, weights)
            perturbed = torch.cat((perturbed, stream))
        else:
            perturbed = stream
        reference = runner.layer(reference, weights)
        if progress is not None:
            progress((index + 1) / (config.num_layers + 1))
    assert perturbed is not None
    log_p = runner.log_probabilities(torch.cat((reference, perturbed)))
    reference_log_p, perturbed_log_p = log_p[0], log_p[1:]
    p = reference_log_p.exp()
    kl = (p[None] * (reference_log_p[None] - perturbed_log_p)).sum(-1).mean(-1)
    if progress is not None:
        progress(1.0)
    return [LayerSensitivity(layer=index, kl=float(value)) for index, value in enumerate(kl)]


def _quantized_layer(
    model: DecodeStepModel, plan: QuantPlan, index: int
) -> dict[str, torch.Tensor]:
    """Layer ``index``'s weights as the device would see them with the base (unpromoted) scheme."""
    unpromoted = QuantPlan(plan.recipe, plan.tied, frozenset(), plan._cache)
    replaced = {}
    prefix = f"model.layers.{index}."
    for name, parameter in model.model.layers[index].named_parameters():
        full = prefix + name
        compressed = unpromoted.compress(full, parameter.detach().to(torch.float16))
        if compressed is not None:
            replaced[full] = decompress(compressed)
    return replaced


def rank(sensitivities: Sequence[LayerSensitivity]) -> list[LayerSensitivity]:
    return sorted(sensitivities, key=lambda item: (-item.kl, item.layer))


def promoted_layers(recipe: QuantRecipe, ranking: Sequence[LayerSensitivity]) -> frozenset[int]:
    return frozenset(item.layer for item in ranking[: recipe.promote_top])
