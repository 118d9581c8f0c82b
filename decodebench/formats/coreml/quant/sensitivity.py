"""Per-layer quantization sensitivity, measured: KL of next-token distributions against fp16.

For each decoder layer i, only layer i's attention and FFN weights are quantized (with the
recipe's base schemes) and the calibration prompts run through the model; the score is the mean
KL(p_fp16 || p_quantized) over every position. Layers are ranked by it; ``topK`` promotes the
first K.

Done naively that is L full forward passes. Here it is one pass, layer-synchronous: the fp16
hidden states entering each layer are computed once; at layer k the streams perturbed at layers
0..k-1 go through layer k together with the reference (one batched matmul, each weight read
once) and the stream perturbed at layer k joins them. The arithmetic is the naive one's, but each
layer's weights are read and converted once instead of once per stream, the lm_head once in all,
and the KL is accumulated over vocabulary blocks (no [streams, tokens, vocab] tensor).

Cost, and the choices that bound it (measured on the full EXAONE 4.0 1.2B shape, 2 cores):

- The decoder-layer matmuls take bf16 operands (fp32 accumulation; ``MATMUL_DTYPE``); norms,
  RoPE, attention softmax, residuals and the whole lm_head/KL stay fp32. That halves the
  dominant cost (~1.1 TFLOP of layer matmuls for 32 tokens) and moves the KLs by at most 1.3%
  against all-fp32, with the identical ranking; the calibration sample itself moves them by 6-11%
  (1x16, 2x8 or 4x32 tokens against 2x16, again the identical ranking). bf16 rounding is an order
  of magnitude below the sampling error that any affordable calibration set has anyway.
- The calibration set stays 2 prompts x 16 tokens (``CALIBRATION_PROMPTS``/``_TOKENS``).
- The ranking depends on the model, the base schemes and the calibration only (not on context,
  attention layout, KV or prefill), so builds cache it by model identity
  (:class:`decodebench.building.cache.BuildCache`); only a model's first build measures.
- Each layer's quantized weights are computed straight into the matmul dtype, in one pass, and
  not kept for the artifact (for EXAONE that would hold ~1 GB through conversion, for ~1 s).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch.nn import functional

from decodebench.contracts.build import LayerSensitivity
from decodebench.contracts.recipes import QuantRecipe
from decodebench.formats.coreml.quant.apply import QuantPlan, fake_quantize
from decodebench.formats.coreml.quant.numeric import to_dtype
from decodebench.modeling import DecodeStepModel, inverse_frequencies
from decodebench.prompts import builtin_prompts, pseudo_tokenize

CALIBRATION_PROMPTS = 2
CALIBRATION_TOKENS = 16
MATMUL_DTYPE = torch.bfloat16
_HEAD_ROWS = 8192
# Families whose decoder layer `_Runner.layer` reproduces (one pass for every layer's streams).
BATCHED_FAMILIES = frozenset({"llama", "qwen2", "qwen3", "exaone4"})


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


def arithmetic_label(matmul_dtype: torch.dtype) -> str:
    if matmul_dtype == torch.float32:
        return "fp32"
    return f"{str(matmul_dtype).removeprefix('torch.')} layer matmuls, fp32 elsewhere"


def _rms(hidden: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return hidden * torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + eps) * weight.float()


def _linear(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """fp32 activations times a weight already in the matmul dtype; the result in fp32."""
    output = functional.linear(hidden.to(weight.dtype), weight).float()
    return output if bias is None else output + bias.float()


class _Runner:
    """A batched, cache-free forward of the decoder's layers: fp32 activations, matmuls in
    ``matmul_dtype`` (weights converted once per layer), everything else in fp32."""

    def __init__(
        self, model: DecodeStepModel, length: int, matmul_dtype: torch.dtype = MATMUL_DTYPE
    ) -> None:
        self.model = model
        self.config = model.config
        self.matmul_dtype = matmul_dtype
        angles = (
            torch.arange(length, dtype=torch.float64)[:, None]
            * inverse_frequencies(self.config)[None, :]
        )
        angles = torch.cat((angles, angles), dim=-1)
        self.cos, self.sin = angles.cos().float(), angles.sin().float()

    def layer_weights(
        self, index: int, replace: dict[str, torch.Tensor] | None = None
    ) -> dict[str, torch.Tensor]:
        """Layer ``index``'s parameters (keys relative to the layer): matrices in the matmul
        dtype, vectors (norms, biases) in fp32; ``replace`` by full parameter name."""
        prefix = f"model.layers.{index}."
        weights = {}
        for name, parameter in self.model.model.layers[index].named_parameters():
            source = (replace or {}).get(prefix + name, parameter)
            weights[name] = to_dtype(
                source, self.matmul_dtype if source.dim() == 2 else torch.float32
            )
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
            return _linear(attention_in, weights[f"self_attn.{name}_proj.weight"], bias)

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
        attended = _linear(attended, weights["self_attn.o_proj.weight"])
        if config.post_norm:
            flat = flat + _rms(attended, weights["post_attention_layernorm.weight"], eps)
            mlp_in = flat
        else:
            flat = flat + attended
            mlp_in = _rms(flat, weights["post_attention_layernorm.weight"], eps)
        gate = _linear(mlp_in, weights["mlp.gate_proj.weight"])
        up = _linear(mlp_in, weights["mlp.up_proj.weight"])
        mlp_out = _linear(functional.silu(gate) * up, weights["mlp.down_proj.weight"])
        if config.post_norm:
            flat = flat + _rms(mlp_out, weights["post_feedforward_layernorm.weight"], eps)
        else:
            flat = flat + mlp_out
        return flat.view(streams, batch, length, size)

    def kl_to_reference(self, reference: torch.Tensor, streams: torch.Tensor) -> torch.Tensor:
        """Mean KL(p_reference || p_stream) per stream: reference [B, T, H], streams [S, B, T, H].

        The lm_head is widened a block of vocabulary rows at a time and the log-sum-exps and
        the cross term are accumulated online over the blocks (in float64), so no [S, B*T, vocab]
        tensor ever exists: KL = sum_v p_v (z_v - y_v) + lse(y) - lse(z), z the reference's
        logits and y the stream's.
        """
        model = self.model
        head = model.model.embed_tokens.weight if model.lm_head is None else model.lm_head.weight
        hidden = torch.cat((reference[None], streams))
        normed = _rms(hidden, model.model.norm.weight, self.config.rms_norm_eps)
        rows = normed.reshape(-1, normed.shape[-1])
        count = hidden.shape[0]
        positions = rows.shape[0] // count
        maximum = torch.full((count, positions), -math.inf, dtype=torch.float64)
        total = torch.zeros((count, positions), dtype=torch.float64)
        cross = torch.zeros((count - 1, positions), dtype=torch.float64)
        for start in range(0, head.shape[0], _HEAD_ROWS):
            block = head[start : start + _HEAD_ROWS].float()
            logits = torch.matmul(rows, block.T).view(count, positions, -1)
            updated = torch.maximum(maximum, logits.amax(-1).double())
            rescale = torch.exp(maximum - updated)
            shifted = torch.exp(logits - updated[..., None].float())
            total = total * rescale + shifted.sum(-1, dtype=torch.float64)
            difference = logits[0][None] - logits[1:]
            cross = cross * rescale[0][None] + (shifted[0][None] * difference).sum(
                -1, dtype=torch.float64
            )
            maximum = updated
        log_sum_exp = maximum + total.log()
        kl = cross / total[0][None] + log_sum_exp[1:] - log_sum_exp[0][None]
        return kl.mean(-1)


def batched(family: str) -> bool:
    """Whether the one-pass runner reproduces this family's layer. The others (SmolLM3's layers
    without RoPE, Phi-3's partial or LongRoPE rotary, Gemma 3's four norms, windows and scaled
    queries) are measured by :func:`measure_each`, through the family's own layer."""
    return family in BATCHED_FAMILIES


def arithmetic_for(family: str) -> str:
    return arithmetic_label(MATMUL_DTYPE if batched(family) else torch.float32)


@torch.no_grad()
def measure(
    model: DecodeStepModel,
    plan: QuantPlan,
    tokens: torch.Tensor | None = None,
    progress: Callable[[float], None] | None = None,
    matmul_dtype: torch.dtype = MATMUL_DTYPE,
) -> list[LayerSensitivity]:
    """KL per layer (layer order) with only that layer quantized at the recipe's base schemes.

    ``matmul_dtype=torch.float32`` gives the all-fp32 measurement (see the module docstring).
    A family the one-pass runner does not reproduce is measured by :func:`measure_each`.
    """
    config = model.config
    tokens = calibration_tokens(config.vocab_size) if tokens is None else tokens
    if not batched(config.family):
        return measure_each(model, plan, tokens, progress)
    runner = _Runner(model, tokens.shape[1], matmul_dtype)
    reference = model.model.embed_tokens.weight[tokens].float()  # [B, T, H]
    perturbed = reference.new_empty((0, *reference.shape))  # [streams so far, B, T, H]
    for index in range(config.num_layers):
        weights = runner.layer_weights(index)
        quantized = {**weights, **_quantized_layer(model, plan, index, matmul_dtype)}
        stream = runner.layer(reference[None], quantized)
        del quantized
        # The reference and every earlier-perturbed stream share this layer's fp16 weights.
        advanced = runner.layer(torch.cat((reference[None], perturbed)), weights)
        reference, perturbed = advanced[0], torch.cat((advanced[1:], stream))
        del weights, advanced, stream
        if progress is not None:
            progress((index + 1) / (config.num_layers + 1))
    kl = runner.kl_to_reference(reference, perturbed)
    if progress is not None:
        progress(1.0)
    return [LayerSensitivity(layer=index, kl=float(value)) for index, value in enumerate(kl)]


@torch.no_grad()
def measure_each(
    model: DecodeStepModel,
    plan: QuantPlan,
    tokens: torch.Tensor,
    progress: Callable[[float], None] | None = None,
) -> list[LayerSensitivity]:
    """The definition, for any family: an fp32 copy of the decoder itself (its family's own
    layers, a prefill call over each calibration prompt), run once as it is and once per layer
    with only that layer's matrices quantized. L + 1 passes instead of one, all fp32; for the
    families whose layer the one-pass runner does not reproduce."""
    config, length = model.config, tokens.shape[1]
    weights = {
        name: parameter.detach().to(torch.float32, copy=True)
        for name, parameter in model.named_parameters()
    }
    runner = DecodeStepModel(
        config, length, model.attention, torch.float32, "state", length, weights=weights
    )
    reference = _log_probabilities(runner, tokens)
    kls = []
    for index in range(config.num_layers):
        layer = runner.model.layers[index]
        parameters = dict(layer.named_parameters())
        kept = {name: parameters[name].data for name in parameters}
        for name, value in _quantized_layer(model, plan, index, torch.float32).items():
            parameters[name].data = value
        candidate = _log_probabilities(runner, tokens)
        for name, value in kept.items():
            parameters[name].data = value
        kl = (reference.exp() * (reference - candidate)).sum(-1).mean()
        kls.append(float(kl))
        if progress is not None:
            progress((index + 1) / config.num_layers)
    return [LayerSensitivity(layer=index, kl=kl) for index, kl in enumerate(kls)]


def _log_probabilities(runner: DecodeStepModel, tokens: torch.Tensor) -> torch.Tensor:
    """[prompts x positions, vocab] next-token log-probabilities, in float64."""
    rows = []
    for prompt in tokens.tolist():
        runner.reset_cache()
        logits = runner(
            torch.tensor([prompt], dtype=torch.int32), torch.tensor([0], dtype=torch.int32)
        )
        assert isinstance(logits, torch.Tensor)
        rows.append(logits[0])
    return torch.log_softmax(torch.cat(rows).double(), -1)


def _quantized_layer(
    model: DecodeStepModel, plan: QuantPlan, index: int, dtype: torch.dtype
) -> dict[str, torch.Tensor]:
    """Layer ``index``'s matrices as the device would see them with the base (unpromoted)
    scheme, in ``dtype`` (keys relative to the layer). Computed directly, not kept: for EXAONE the
    compressed layers would hold ~1 GB through conversion to save ~1 s of recomputing them."""
    unpromoted = QuantPlan(plan.recipe, plan.tied)
    replaced = {}
    prefix = f"model.layers.{index}."
    for name, parameter in model.model.layers[index].named_parameters():
        scheme = unpromoted.scheme_for(prefix + name)
        if scheme is None or not scheme.compressed:
            continue
        if unpromoted.can_compress(prefix + name, parameter, scheme):
            replaced[name] = fake_quantize(parameter.detach(), scheme, dtype)
    return replaced


def rank(sensitivities: Sequence[LayerSensitivity]) -> list[LayerSensitivity]:
    return sorted(sensitivities, key=lambda item: (-item.kl, item.layer))


def promoted_layers(recipe: QuantRecipe, ranking: Sequence[LayerSensitivity]) -> frozenset[int]:
    return frozenset(item.layer for item in ranking[: recipe.promote_top])
