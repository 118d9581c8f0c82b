"""A Llama-family GQA decoder shaped for Core ML decode: one token per call, KV cache in buffers.

The graph that matters is the decode step (q_len = 1), so the module computes exactly that:

- inputs: ``input_ids`` [1, 1] int32, ``position`` [1] int32 (the index the new token is written
  to, and its RoPE position), ``causal_mask`` [1, 1, 1, context] float (0 where a key is visible,
  ``-inf`` beyond ``position``; see :func:`causal_mask`);
- output: ``logits`` [1, 1, vocab];
- the KV cache lives in per-layer registered buffers ``key_cache_{i}`` / ``value_cache_{i}`` of
  shape [1, Hkv, context, head_dim], written in place at ``position``; coremltools turns each
  into a Core ML state and each write into ``slice_update`` + ``coreml_update_state``.

Per-layer buffers (instead of one [layers, ...] buffer) keep every layer's read a plain
``read_state``: slicing a layer out of a combined cache would add one more context-sized copy
per layer to the graph, the very kind of redundant traffic this project measures.

Module and parameter names follow Hugging Face (``model.layers.0.self_attn.q_proj.weight``, ...)
so a transformers checkpoint of the same shape loads with ``load_state_dict``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional

from decodebench.domain import Attention
from decodebench.presets import ModelConfig

# Small enough that activations and logits stay well inside fp16 range at EXAONE width.
INIT_STD = 0.02
MASKED = float("-inf")


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32 like the reference implementations, so fp16 weights keep fp32 logits
        # comparable; the Core ML fp16 pass drops these casts again.
        input_dtype = hidden.dtype
        hidden32 = hidden.float()
        hidden32 = hidden32 * torch.rsqrt(hidden32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * hidden32.to(input_dtype)


def rotate_half(x: torch.Tensor, half: int) -> torch.Tensor:
    # `half` is a Python int on purpose: `x.shape[-1] // 2` would trace into shape arithmetic.
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope_tables(config: ModelConfig, context: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of every position, [context, head_dim], computed in fp64.

    A table lookup instead of ``position * inv_freq`` in the graph: in fp16 the product loses the
    low bits of large positions, the table does not.
    """
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    angles = torch.arange(context, dtype=torch.float64)[:, None] * inv_freq[None, :]
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos().float(), angles.sin().float()


class GroupedQueryAttention(nn.Module):
    def __init__(self, config: ModelConfig, attention: Attention) -> None:
        super().__init__()
        if config.num_attention_heads % config.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        self.attention = attention
        self.query_heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.group_size = config.group_size
        self.head_dim = config.head_dim
        self.scale = config.head_dim**-0.5
        hidden, head_dim = config.hidden_size, config.head_dim
        qkv_bias = config.family == "qwen2"
        self.q_proj = nn.Linear(hidden, self.query_heads * head_dim, bias=qkv_bias)
        self.k_proj = nn.Linear(hidden, self.kv_heads * head_dim, bias=qkv_bias)
        self.v_proj = nn.Linear(hidden, self.kv_heads * head_dim, bias=qkv_bias)
        self.o_proj = nn.Linear(self.query_heads * head_dim, hidden, bias=False)
        # EXAONE 4 normalises every query and key head before RoPE ("QK-norm").
        self.qk_norm = config.family == "exaone4"
        if self.qk_norm:
            self.q_norm = RMSNorm(head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(head_dim, config.rms_norm_eps)

    def forward(
        self,
        hidden: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        causal_mask: torch.Tensor,
        position: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
    ) -> torch.Tensor:
        head_dim = self.head_dim
        query = self.q_proj(hidden).view(1, 1, self.query_heads, head_dim).transpose(1, 2)
        key = self.k_proj(hidden).view(1, 1, self.kv_heads, head_dim).transpose(1, 2)
        value = self.v_proj(hidden).view(1, 1, self.kv_heads, head_dim).transpose(1, 2)
        if self.qk_norm:
            query = self.q_norm(query)
            key = self.k_norm(key)
        half = head_dim // 2
        query = query * cos + rotate_half(query, half) * sin
        key = key * cos + rotate_half(key, half) * sin

        # In-place write of this token's K and V: becomes slice_update + coreml_update_state.
        key_cache[:, :, position : position + 1, :] = key
        value_cache[:, :, position : position + 1, :] = value

        if self.attention == Attention.repeat_kv:
            context = self.repeat_kv(query, key_cache, value_cache, causal_mask)
        else:
            context = self.folded(query, key_cache, value_cache, causal_mask)
        # [1, Hq, 1, D] -> [1, 1, Hq * D]
        context = context.transpose(1, 2).reshape(1, 1, self.query_heads * head_dim)
        return self.o_proj(context)

    def _attend(
        self,
        query: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        causal_mask: torch.Tensor,
    ) -> torch.Tensor:
        # Every op between the two matmuls works row by row over the key axis, which is what
        # makes the query fold exact.
        scores = torch.matmul(query, keys.transpose(-1, -2)) * self.scale + causal_mask
        probabilities = functional.softmax(scores.float(), dim=-1).to(query.dtype)
        return torch.matmul(probabilities, values)

    def repeat_kv(
        self,
        query: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        causal_mask: torch.Tensor,
    ) -> torch.Tensor:
        """The reference layout: replicate each KV head G times (query head h reads KV h // G).

        expand + reshape of a stride-0 view copies; in MIL it becomes a ``tile`` op per tensor.
        """
        shape = (1, self.kv_heads, self.group_size, key_cache.shape[2], self.head_dim)
        replicated = (1, self.query_heads, key_cache.shape[2], self.head_dim)
        keys = key_cache[:, :, None, :, :].expand(shape).reshape(replicated)
        values = value_cache[:, :, None, :, :].expand(shape).reshape(replicated)
        return self._attend(query, keys, values, causal_mask)

    def folded(
        self,
        query: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        causal_mask: torch.Tensor,
    ) -> torch.Tensor:
        """Fold the query instead: [1, Hq, 1, D] -> [1, Hkv, G, D], a pure reshape at q_len 1.

        Row g of KV head kv is query head h = G * kv + g, the same grouping repeat_kv uses.
        """
        grouped = query.reshape(1, self.kv_heads, self.group_size, self.head_dim)
        context = self._attend(grouped, key_cache, value_cache, causal_mask)
        return context.reshape(1, self.query_heads, 1, self.head_dim)


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.down_proj(functional.silu(self.gate_proj(hidden)) * self.up_proj(hidden))


class DecoderLayer(nn.Module):
    """Pre-norm (Llama, Qwen2) or EXAONE 4's post-norm of each sub-block's output.

    The attribute names are Hugging Face's; note ``post_attention_layernorm`` is the norm
    *before* the MLP in Llama but the norm of the attention *output* in EXAONE 4.
    """

    def __init__(self, config: ModelConfig, attention: Attention) -> None:
        super().__init__()
        self.post_norm = config.family == "exaone4"
        eps = config.rms_norm_eps
        self.self_attn = GroupedQueryAttention(config, attention)
        self.mlp = MLP(config)
        if self.post_norm:
            self.post_attention_layernorm = RMSNorm(config.hidden_size, eps)
            self.post_feedforward_layernorm = RMSNorm(config.hidden_size, eps)
        else:
            self.input_layernorm = RMSNorm(config.hidden_size, eps)
            self.post_attention_layernorm = RMSNorm(config.hidden_size, eps)

    def forward(
        self,
        hidden: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        causal_mask: torch.Tensor,
        position: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
    ) -> torch.Tensor:
        attention_args = (cos, sin, causal_mask, position, key_cache, value_cache)
        if self.post_norm:
            attended = self.self_attn(hidden, *attention_args)
            hidden = hidden + self.post_attention_layernorm(attended)
            return hidden + self.post_feedforward_layernorm(self.mlp(hidden))
        hidden = hidden + self.self_attn(self.input_layernorm(hidden), *attention_args)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class DecoderBody(nn.Module):
    def __init__(self, config: ModelConfig, attention: Attention) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            [DecoderLayer(config, attention) for _ in range(config.num_layers)]
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class DecodeStepModel(nn.Module):
    """One decode step of the whole model; the KV cache is module state between calls."""

    rope_cos: torch.Tensor
    rope_sin: torch.Tensor

    def __init__(
        self,
        config: ModelConfig,
        context: int,
        attention: Attention | str = Attention.folded,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        self.config = config
        self.context = context
        self.attention = Attention(attention)
        self.dtype = dtype
        # Built on the meta device, then allocated once in the target dtype: the full EXAONE
        # shape would otherwise spend ~5 GB and many seconds on a default fp32 init we overwrite.
        with torch.device("meta"):
            self.model = DecoderBody(config, self.attention)
            self.lm_head = (
                None
                if config.tie_word_embeddings
                else nn.Linear(config.hidden_size, config.vocab_size, bias=False)
            )
        self.to_empty(device="cpu")
        self.to(dtype)
        self._initialize_weights()
        cos, sin = rope_tables(config, context)
        self.register_buffer("rope_cos", cos.to(dtype), persistent=False)
        self.register_buffer("rope_sin", sin.to(dtype), persistent=False)
        cache_shape = (1, config.num_key_value_heads, context, config.head_dim)
        for index in range(config.num_layers):
            self.register_buffer(
                f"key_cache_{index}", torch.zeros(cache_shape, dtype=dtype), persistent=False
            )
            self.register_buffer(
                f"value_cache_{index}", torch.zeros(cache_shape, dtype=dtype), persistent=False
            )

    def _initialize_weights(self) -> None:
        # One generator in parameter order: same seed, same weights, whatever the attention
        # layout or dtype (values are drawn in fp32 and rounded once).
        generator = torch.Generator().manual_seed(self.config.seed)
        with torch.no_grad():
            for name, parameter in self.named_parameters():
                noise = torch.randn(parameter.shape, generator=generator) * INIT_STD
                if name.endswith("norm.weight"):
                    noise += 1.0
                elif name.endswith(".bias"):
                    noise.zero_()
                parameter.copy_(noise)

    def cache_names(self) -> list[str]:
        """Buffer names of the KV cache, in layer order (keys and values interleaved)."""
        names = []
        for index in range(self.config.num_layers):
            names += [f"key_cache_{index}", f"value_cache_{index}"]
        return names

    def caches(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        key_cache = getattr(self, f"key_cache_{index}")
        value_cache = getattr(self, f"value_cache_{index}")
        return key_cache, value_cache

    def reset_cache(self) -> None:
        for name in self.cache_names():
            getattr(self, name).zero_()

    def forward(
        self, input_ids: torch.Tensor, position: torch.Tensor, causal_mask: torch.Tensor
    ) -> torch.Tensor:
        hidden = self.model.embed_tokens(input_ids)
        head_dim = self.config.head_dim
        cos = torch.index_select(self.rope_cos, 0, position).view(1, 1, 1, head_dim)
        sin = torch.index_select(self.rope_sin, 0, position).view(1, 1, 1, head_dim)
        mask = causal_mask.to(hidden.dtype)
        for index, layer in enumerate(self.model.layers):
            key_cache, value_cache = self.caches(index)
            hidden = layer(hidden, cos, sin, mask, position, key_cache, value_cache)
        hidden = self.model.norm(hidden)
        lm_head_weight = (
            self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        )
        # Tied: reuse the embedding parameter itself so the converted graph holds one copy.
        return functional.linear(hidden, lm_head_weight)


def build_model(
    config: ModelConfig,
    context: int,
    attention: Attention | str = Attention.folded,
    dtype: torch.dtype = torch.float32,
) -> DecodeStepModel:
    return DecodeStepModel(config, context, attention, dtype).eval()


def causal_mask(position: int, context: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """[1, 1, 1, context]: 0 for keys 0..position, -inf after (never fully masked: key 0 is seen)."""
    if not 0 <= position < context:
        raise ValueError(f"position {position} outside the context of {context} tokens")
    mask = torch.full((1, 1, 1, context), MASKED, dtype=dtype)
    mask[..., : position + 1] = 0
    return mask


def step_inputs(
    token: int, position: int, context: int, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The three inputs of one decode step, in forward order."""
    return (
        torch.tensor([[token]], dtype=torch.int32),
        torch.tensor([position], dtype=torch.int32),
        causal_mask(position, context, dtype),
    )


@torch.no_grad()
def greedy_decode(
    model: DecodeStepModel, prompt: Sequence[int], steps: int
) -> tuple[list[int], list[torch.Tensor]]:
    """Feed ``prompt`` one token at a time, then pick the argmax ``steps`` times.

    Returns the generated tokens and the logits [vocab] of every step (prompt steps included).
    Resets the cache first, so calls are independent.
    """
    if not prompt:
        raise ValueError("prompt must hold at least one token")
    if len(prompt) + steps - 1 > model.context:
        raise ValueError(f"{len(prompt)} + {steps} tokens exceed the context of {model.context}")
    model.reset_cache()
    generated: list[int] = []
    all_logits: list[torch.Tensor] = []
    token = prompt[0]
    for position in range(len(prompt) + steps - 1):
        logits = model(*step_inputs(token, position, model.context))[0, -1]
        all_logits.append(logits.float())
        if position + 1 < len(prompt):
            token = prompt[position + 1]
        else:
            token = int(torch.argmax(logits))
            generated.append(token)
    return generated, all_logits


def parameter_count(model: nn.Module) -> int:
    return sum(math.prod(parameter.shape) for parameter in model.parameters())
