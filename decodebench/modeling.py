"""A Llama-family GQA decoder shaped for Core ML: a fixed number of query tokens per call.

One module class serves every variant axis that changes the graph:

- ``query_length`` 1 is the **decode** step; ``query_length`` C > 1 is a **prefill** chunk.
- ``kv="state"``: the KV cache lives in per-layer registered buffers ``key_cache_{i}`` /
  ``value_cache_{i}`` [1, Hkv, context, head_dim], written in place at ``position``; coremltools
  turns each into a Core ML state and each write into ``slice_update`` + a state write.
- ``kv="input"``: the cache is read-only model input (same names and shapes); the step returns
  the new tokens' K and V (``key_{i}`` / ``value_{i}`` [1, Hkv, C, head_dim]) and the host writes
  them into its cache. Attention then covers the cache *and* the new tokens: scores over both are
  concatenated before one softmax, so no context-sized tensor is copied.

Inputs, in forward order:

- decode: ``input_ids`` [1, 1] int32, ``position`` [1] int32, ``causal_mask`` [1, 1, 1, context]
  (0 where a cache slot is visible, ``-inf`` elsewhere; see :func:`causal_mask`: with
  ``kv="state"`` slots ``0..position`` are visible, the new token's own slot included; with
  ``kv="input"`` slots ``0..position-1``, the new token is attended separately), then with
  ``kv="input"`` the caches, keys and values interleaved by layer;
- prefill: ``input_ids`` [1, C], ``position`` [1] (the chunk holds positions
  ``position .. position+C-1``), then the caches with ``kv="input"``. The prefill mask is built in
  the graph from ``position``: the host needs nothing layout-specific, and in the folded layout
  it is built directly on the merged group×sequence axis (no ``tile``).

Output ``logits`` [1, C, vocab] (then the new K/V with ``kv="input"``).

Per-layer buffers (instead of one [layers, ...] buffer) keep every layer's read a plain
``read_state``: slicing a layer out of a combined cache would add one more context-sized copy
per layer to the graph, the very kind of redundant traffic this project measures.

Module and parameter names follow Hugging Face (``model.layers.0.self_attn.q_proj.weight``, ...)
so a transformers checkpoint of the same shape loads with ``load_state_dict``.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import torch
from torch import nn
from torch.nn import functional

from decodebench.domain import Attention, KVCache
from decodebench.presets import ModelConfig

# Small enough that activations and logits stay well inside fp16 range at EXAONE width.
INIT_STD = 0.02
MASKED = float("-inf")
INIT_THREADS = 2


class RMSNorm(nn.Module):
    """``weight * x / sqrt(mean(x^2) + eps)``, formulated so fp16 cannot overflow.

    Real checkpoints carry residual streams whose mean of squares passes 10^6 (SmolLM2-135M from
    layer 12 on), far beyond fp16's 65,504, and the Neural Engine computes in fp16. So x is
    divided by ``s = max(max|x|, 1)`` before squaring: every square is at most 1, and the
    identity ``x / sqrt(mean(x^2) + eps) = (x/s) / sqrt(mean((x/s)^2) + (sqrt(eps)/s)^2)`` keeps
    the result exact (eps included; ``sqrt(eps)/s`` never overflows and at worst underflows to
    0 when eps is negligible). Activations already within [-1, 1] get ``s = 1``: unchanged.
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
        scale = hidden32.abs().amax(-1, keepdim=True).clamp_min(1.0)
        scaled = hidden32 / scale
        variance = scaled.pow(2).mean(-1, keepdim=True) + (self.sqrt_eps / scale).pow(2)
        return self.weight * (scaled * torch.rsqrt(variance)).to(input_dtype)


def rotate_half(x: torch.Tensor, half: int) -> torch.Tensor:
    # `half` is a Python int on purpose: `x.shape[-1] // 2` would trace into shape arithmetic.
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def inverse_frequencies(config: ModelConfig) -> torch.Tensor:
    """RoPE inverse frequencies in fp64, with Llama 3 scaling when the config has it."""
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    scaling = config.rope_scaling
    if scaling is None:
        return inv_freq
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


def rope_tables(config: ModelConfig, context: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of every position, [context, head_dim], computed in fp64.

    A table lookup instead of ``position * inv_freq`` in the graph: in fp16 the product loses the
    low bits of large positions, the table does not.
    """
    inv_freq = inverse_frequencies(config)
    angles = torch.arange(context, dtype=torch.float64)[:, None] * inv_freq[None, :]
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos().float(), angles.sin().float()


class GroupedQueryAttention(nn.Module):
    def __init__(
        self,
        config: ModelConfig,
        attention: Attention,
        kv: KVCache = KVCache.state,
        query_length: int = 1,
    ) -> None:
        super().__init__()
        self.attention = attention
        self.kv = kv
        self.query_length = query_length
        self.query_heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.group_size = config.group_size
        self.head_dim = config.head_dim
        self.scale = config.head_dim**-0.5
        hidden, head_dim = config.hidden_size, config.head_dim
        self.q_proj = nn.Linear(hidden, self.query_heads * head_dim, bias=config.qkv_bias)
        self.k_proj = nn.Linear(hidden, self.kv_heads * head_dim, bias=config.qkv_bias)
        self.v_proj = nn.Linear(hidden, self.kv_heads * head_dim, bias=config.qkv_bias)
        self.o_proj = nn.Linear(self.query_heads * head_dim, hidden, bias=False)
        self.qk_norm = config.qk_norm
        if self.qk_norm:
            self.q_norm = RMSNorm(head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(head_dim, config.rms_norm_eps)

    def forward(
        self,
        hidden: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor,
        position: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        new_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Returns the attention output and this call's K and V ([1, Hkv, C, D])."""
        length, head_dim = self.query_length, self.head_dim
        query = self.q_proj(hidden).view(1, length, self.query_heads, head_dim).transpose(1, 2)
        key = self.k_proj(hidden).view(1, length, self.kv_heads, head_dim).transpose(1, 2)
        value = self.v_proj(hidden).view(1, length, self.kv_heads, head_dim).transpose(1, 2)
        if self.qk_norm:
            query = self.q_norm(query)
            key = self.k_norm(key)
        half = head_dim // 2
        query = query * cos + rotate_half(query, half) * sin
        key = key * cos + rotate_half(key, half) * sin

        if self.kv == KVCache.state:
            # In-place write of these tokens' K and V: becomes slice_update + a state write.
            key_cache[:, :, position : position + length, :] = key
            value_cache[:, :, position : position + length, :] = value
            if self.attention == Attention.repeat_kv:
                context = self.repeat_kv(query, key_cache, value_cache, mask)
            else:
                context = self.folded(query, key_cache, value_cache, mask)
        else:
            context = self.attend_with_new(
                query, key_cache, value_cache, key, value, mask, new_mask
            )
        # [1, Hq, C, D] -> [1, C, Hq * D]
        context = context.transpose(1, 2).reshape(1, length, self.query_heads * head_dim)
        # A no-op in torch, but traced: coremltools reads states and fp16 inputs as fp32, so without
        # it o_proj's weight is promoted to an fp32 copy (then cast back to another fp16 copy,
        # ~0.75 GB and 2 s at EXAONE size). The fp16 pass removes the cast again.
        context = context.to(self.o_proj.weight.dtype)
        return self.o_proj(context), key, value

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

    def _replicate(self, tensor: torch.Tensor) -> torch.Tensor:
        """[1, Hkv, T, D] -> [1, Hq, T, D], KV head h // G for query head h (a tile in MIL)."""
        length = tensor.shape[2]
        shape = (1, self.kv_heads, self.group_size, length, self.head_dim)
        replicated = (1, self.query_heads, length, self.head_dim)
        return tensor[:, :, None, :, :].expand(shape).reshape(replicated)

    def _fold(self, query: torch.Tensor) -> torch.Tensor:
        """[1, Hq, C, D] -> [1, Hkv, G*C, D]: row g*C + c of KV head kv is query head G*kv + g."""
        return query.reshape(1, self.kv_heads, self.group_size * self.query_length, self.head_dim)

    def _unfold(self, context: torch.Tensor) -> torch.Tensor:
        return context.reshape(1, self.query_heads, self.query_length, self.head_dim)

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
        keys, values = self._replicate(key_cache), self._replicate(value_cache)
        return self._attend(query, keys, values, causal_mask)

    def folded(
        self,
        query: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        causal_mask: torch.Tensor,
    ) -> torch.Tensor:
        """Fold the query instead: [1, Hq, C, D] -> [1, Hkv, G*C, D], a pure reshape.

        At C = 1 the rows of KV head kv are its G query heads; at C > 1 the group and sequence
        axes merge (rank 4 kept), so the mask must be laid out on that merged axis too.
        """
        context = self._attend(self._fold(query), key_cache, value_cache, causal_mask)
        return self._unfold(context)

    def attend_with_new(
        self,
        query: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        cache_mask: torch.Tensor,
        new_mask: torch.Tensor | None,
    ) -> torch.Tensor:
        """Attention over a read-only cache plus this call's own keys (``kv="input"``).

        One softmax over [cache scores | new scores]: exact, and the only concatenation is of
        scores, never of the context-sized K/V.
        """
        if self.attention == Attention.repeat_kv:
            rows = query
            key_cache, value_cache = self._replicate(key_cache), self._replicate(value_cache)
            key, value = self._replicate(key), self._replicate(value)
        else:
            rows = self._fold(query)
        cache_scores = torch.matmul(rows, key_cache.transpose(-1, -2)) * self.scale + cache_mask
        new_scores = torch.matmul(rows, key.transpose(-1, -2)) * self.scale
        if new_mask is not None:
            new_scores = new_scores + new_mask
        scores = torch.cat((cache_scores, new_scores), dim=-1)
        probabilities = functional.softmax(scores.float(), dim=-1).to(query.dtype)
        context_length = key_cache.shape[2]
        context = torch.matmul(probabilities[..., :context_length], value_cache) + torch.matmul(
            probabilities[..., context_length:], value
        )
        return context if self.attention == Attention.repeat_kv else self._unfold(context)


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

    def __init__(
        self, config: ModelConfig, attention: Attention, kv: KVCache, query_length: int
    ) -> None:
        super().__init__()
        self.post_norm = config.post_norm
        eps = config.rms_norm_eps
        self.self_attn = GroupedQueryAttention(config, attention, kv, query_length)
        self.mlp = MLP(config)
        if self.post_norm:
            self.post_attention_layernorm = RMSNorm(config.hidden_size, eps)
            self.post_feedforward_layernorm = RMSNorm(config.hidden_size, eps)
        else:
            self.input_layernorm = RMSNorm(config.hidden_size, eps)
            self.post_attention_layernorm = RMSNorm(config.hidden_size, eps)

    def forward(
        self, hidden: torch.Tensor, *attention_args: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self.post_norm:
            attended, key, value = self.self_attn(hidden, *attention_args)
            hidden = hidden + self.post_attention_layernorm(attended)
            return hidden + self.post_feedforward_layernorm(self.mlp(hidden)), key, value
        attended, key, value = self.self_attn(self.input_layernorm(hidden), *attention_args)
        hidden = hidden + attended
        return hidden + self.mlp(self.post_attention_layernorm(hidden)), key, value


class DecoderBody(nn.Module):
    def __init__(
        self, config: ModelConfig, attention: Attention, kv: KVCache, query_length: int
    ) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            [DecoderLayer(config, attention, kv, query_length) for _ in range(config.num_layers)]
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


def parameter_seed(seed: int, name: str) -> int:
    """Each parameter has its own stream: its values depend on the seed and its name only."""
    return (seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63)


class DecodeStepModel(nn.Module):
    """One call of the whole model (decode step or prefill chunk); see the module docstring."""

    rope_cos: torch.Tensor
    rope_sin: torch.Tensor
    row_offsets: torch.Tensor
    token_offsets: torch.Tensor
    key_positions: torch.Tensor
    new_token_mask: torch.Tensor

    def __init__(
        self,
        config: ModelConfig,
        context: int,
        attention: Attention | str = Attention.folded,
        dtype: torch.dtype = torch.float32,
        kv: KVCache | str = KVCache.state,
        query_length: int = 1,
        weights: dict[str, torch.Tensor] | None = None,
    ) -> None:
        super().__init__()
        if not 1 <= query_length <= context:
            raise ValueError(f"query_length {query_length} must be 1..{context}")
        self.config = config
        self.context = context
        self.attention = Attention(attention)
        self.kv = KVCache(kv)
        self.query_length = query_length
        self.dtype = dtype
        # Built on the meta device, then allocated once in the target dtype: the full EXAONE
        # shape would otherwise spend ~5 GB and many seconds on a default fp32 init we overwrite.
        with torch.device("meta"):
            self.model = DecoderBody(config, self.attention, self.kv, query_length)
            self.lm_head = (
                None
                if config.tie_word_embeddings
                else nn.Linear(config.hidden_size, config.vocab_size, bias=False)
            )
        if weights is None:
            # Cast while still on meta (free), so the one real allocation is already in `dtype`:
            # an fp32 `to_empty` first would cost ~4 CPU-s and ~0.6 GB of peak at EXAONE size.
            self.to(dtype)
            self.to_empty(device="cpu")
            self._initialize_weights()
        else:
            self._assign_weights(weights)
        cos, sin = rope_tables(config, context)
        self.register_buffer("rope_cos", cos.to(dtype), persistent=False)
        self.register_buffer("rope_sin", sin.to(dtype), persistent=False)
        self._register_constants()
        if self.kv == KVCache.state:
            cache_shape = (1, config.num_key_value_heads, context, config.head_dim)
            for name in self.cache_names():
                self.register_buffer(name, torch.zeros(cache_shape, dtype=dtype), persistent=False)

    def _register_constants(self) -> None:
        # Positions of the query rows relative to `position`: on the merged group x sequence axis
        # in the folded layout (row g*C + c is token c), one row per token otherwise.
        length, group = self.query_length, self.config.group_size
        rows = torch.arange(length, dtype=torch.int32)
        if self.attention == Attention.folded:
            rows = rows.repeat(group)
        self.query_rows = len(rows)
        self.register_buffer("row_offsets", rows, persistent=False)
        self.register_buffer(
            "token_offsets", torch.arange(length, dtype=torch.int32), persistent=False
        )
        self.register_buffer(
            "key_positions", torch.arange(self.context, dtype=torch.int32), persistent=False
        )
        # kv="input": causal mask among the call's own tokens, a constant [1, 1, rows, C].
        visible = rows[:, None] >= torch.arange(length, dtype=torch.int32)[None, :]
        new_mask = torch.zeros(visible.shape, dtype=self.dtype).masked_fill(~visible, MASKED)
        self.register_buffer("new_token_mask", new_mask[None, None], persistent=False)

    def _initialize_weights(self) -> None:
        # Values are drawn in fp16, the width the package stores, and widened for an fp32 model:
        # fp16 and fp32 models of one seed hold the same numbers.
        parameters = sorted(self.named_parameters(), key=lambda item: -item[1].numel())

        def fill(item: tuple[str, nn.Parameter]) -> None:
            name, parameter = item
            generator = torch.Generator().manual_seed(parameter_seed(self.config.seed, name))
            with torch.no_grad():
                if parameter.dtype == torch.float16:
                    values = parameter.data
                else:
                    values = torch.empty(parameter.shape, dtype=torch.float16)
                values.normal_(0.0, INIT_STD, generator=generator)
                if name.endswith("norm.weight"):
                    values += 1.0
                if values is not parameter.data:
                    parameter.data.copy_(values)

        # torch releases the GIL while filling: two threads halve the EXAONE init time.
        with ThreadPoolExecutor(INIT_THREADS) as pool:
            list(pool.map(fill, parameters))

    def _assign_weights(self, weights: dict[str, torch.Tensor]) -> None:
        expected = {name: parameter.shape for name, parameter in self.named_parameters()}
        missing = sorted(set(expected) - set(weights))
        if missing:
            more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            raise KeyError(f"weights lack {missing[0]}{more}")
        state = {}
        for name, shape in expected.items():
            tensor = weights[name]
            if tuple(tensor.shape) != tuple(shape):
                raise ValueError(f"{name}: shape {tuple(tensor.shape)}, expected {tuple(shape)}")
            state[name] = tensor if tensor.dtype == self.dtype else tensor.to(self.dtype)
        self.load_state_dict(state, strict=False, assign=True)

    def sibling(self, query_length: int) -> DecodeStepModel:
        """The same model for another query length, sharing weights (and the state cache)."""
        twin = DecodeStepModel(
            self.config,
            self.context,
            self.attention,
            self.dtype,
            self.kv,
            query_length,
            weights=dict(self.named_parameters()),
        )
        if self.kv == KVCache.state:
            for name in self.cache_names():
                setattr(twin, name, getattr(self, name))
        return twin.eval()

    def cache_names(self) -> list[str]:
        """KV cache names (buffers or inputs), in layer order, keys and values interleaved."""
        names = []
        for index in range(self.config.num_layers):
            names += [f"key_cache_{index}", f"value_cache_{index}"]
        return names

    def new_kv_names(self) -> list[str]:
        """Output names of the new K/V with ``kv="input"``, in layer order."""
        names = []
        for index in range(self.config.num_layers):
            names += [f"key_{index}", f"value_{index}"]
        return names

    def caches(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        key_cache = getattr(self, f"key_cache_{index}")
        value_cache = getattr(self, f"value_cache_{index}")
        return key_cache, value_cache

    def reset_cache(self) -> None:
        if self.kv == KVCache.state:
            for name in self.cache_names():
                getattr(self, name).zero_()

    def forward(
        self, input_ids: torch.Tensor, position: torch.Tensor, *rest: torch.Tensor
    ) -> torch.Tensor | tuple[torch.Tensor, ...]:
        head_dim, length = self.config.head_dim, self.query_length
        hidden = self.model.embed_tokens(input_ids)
        if length == 1:
            causal, caches = rest[0].to(hidden.dtype), rest[1:]
            positions = position
        else:
            caches = rest
            positions = position + self.token_offsets
            causal = self._prefill_mask(position)
        cos = torch.index_select(self.rope_cos, 0, positions).view(1, 1, length, head_dim)
        sin = torch.index_select(self.rope_sin, 0, positions).view(1, 1, length, head_dim)
        new_mask = self.new_token_mask if self.kv == KVCache.input and length > 1 else None
        new_kv: list[torch.Tensor] = []
        for index, layer in enumerate(self.model.layers):
            if self.kv == KVCache.state:
                key_cache, value_cache = self.caches(index)
            else:
                key_cache, value_cache = caches[2 * index], caches[2 * index + 1]
            hidden, key, value = layer(
                hidden, cos, sin, causal, position, key_cache, value_cache, new_mask
            )
            new_kv += [key, value]
        hidden = self.model.norm(hidden)
        lm_head_weight = (
            self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        )
        # Tied: reuse the embedding parameter itself so the converted graph holds one copy.
        logits = functional.linear(hidden, lm_head_weight)
        if self.kv == KVCache.state:
            return logits
        return (logits, *new_kv)

    def _prefill_mask(self, position: torch.Tensor) -> torch.Tensor:
        """[1, 1, rows, context]: the cache slots each query row may see, from ``position``."""
        # Shapes as Python ints: traced tensor sizes would become shape arithmetic in the graph.
        if self.kv == KVCache.state:
            # Slots up to the row's own position (this call's tokens are written first).
            row_positions = position + self.row_offsets
            visible = self.key_positions[None, :] <= row_positions[:, None]
            shape = (self.query_rows, self.context)
        else:
            # Only what the host cached before this call; the new tokens come separately.
            visible = (self.key_positions < position)[None, :]
            shape = (1, self.context)
        mask = torch.zeros(shape, dtype=self.dtype).masked_fill(~visible, MASKED)
        return mask[None, None]


def build_model(
    config: ModelConfig,
    context: int,
    attention: Attention | str = Attention.folded,
    dtype: torch.dtype = torch.float32,
    kv: KVCache | str = KVCache.state,
    query_length: int = 1,
    weights: dict[str, torch.Tensor] | None = None,
) -> DecodeStepModel:
    return DecodeStepModel(config, context, attention, dtype, kv, query_length, weights).eval()


def causal_mask(
    position: int,
    context: int,
    dtype: torch.dtype = torch.float32,
    kv: KVCache | str = KVCache.state,
) -> torch.Tensor:
    """[1, 1, 1, context] decode mask: 0 for visible cache slots, -inf after.

    ``kv="state"``: slots 0..position (the token's own slot is written first, so key 0 is always
    seen). ``kv="input"``: slots 0..position-1 (the new token is attended separately).
    """
    if not 0 <= position < context:
        raise ValueError(f"position {position} outside the context of {context} tokens")
    visible = position + 1 if KVCache(kv) == KVCache.state else position
    mask = torch.full((1, 1, 1, context), MASKED, dtype=dtype)
    mask[..., :visible] = 0
    return mask


def step_inputs(
    token: int,
    position: int,
    context: int,
    dtype: torch.dtype = torch.float32,
    kv: KVCache | str = KVCache.state,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The three leading inputs of one decode step, in forward order."""
    return (
        torch.tensor([[token]], dtype=torch.int32),
        torch.tensor([position], dtype=torch.int32),
        causal_mask(position, context, dtype, kv),
    )


class HostCache:
    """The host's side of ``kv="input"``: the cache arrays, and writing each call's new K/V."""

    def __init__(self, model: DecodeStepModel) -> None:
        config = model.config
        shape = (1, config.num_key_value_heads, model.context, config.head_dim)
        self.tensors = [torch.zeros(shape, dtype=model.dtype) for _ in model.cache_names()]

    def write(self, position: int, new_kv: Sequence[torch.Tensor]) -> None:
        for cache, new in zip(self.tensors, new_kv, strict=True):
            cache[:, :, position : position + new.shape[2], :] = new


def example_inputs(model: DecodeStepModel, position: int = 0) -> tuple[torch.Tensor, ...]:
    """Inputs of one call at ``position`` (token 0s, empty caches): for tracing."""
    if model.query_length == 1:
        leading: tuple[torch.Tensor, ...] = step_inputs(
            0, position, model.context, model.dtype, model.kv
        )
    else:
        leading = (
            torch.zeros((1, model.query_length), dtype=torch.int32),
            torch.tensor([position], dtype=torch.int32),
        )
    if model.kv == KVCache.state:
        return leading
    return (*leading, *HostCache(model).tensors)


@torch.no_grad()
def run_call(
    model: DecodeStepModel, tokens: Sequence[int], position: int, host: HostCache | None
) -> torch.Tensor:
    """One decode step or prefill chunk at ``position``; returns logits [len(tokens), vocab]."""
    if len(tokens) != model.query_length:
        raise ValueError(f"model takes {model.query_length} tokens per call, got {len(tokens)}")
    ids = torch.tensor([list(tokens)], dtype=torch.int32)
    where = torch.tensor([position], dtype=torch.int32)
    inputs: list[torch.Tensor] = [ids, where]
    if model.query_length == 1:
        inputs.append(causal_mask(position, model.context, model.dtype, model.kv))
    if model.kv == KVCache.input:
        assert host is not None
        inputs += host.tensors
    output = model(*inputs)
    if model.kv == KVCache.state:
        assert isinstance(output, torch.Tensor)
        return output[0]
    assert host is not None
    logits, *new_kv = output
    host.write(position, new_kv)
    return logits[0]


@torch.no_grad()
def greedy_decode(
    model: DecodeStepModel,
    prompt: Sequence[int],
    steps: int,
    prefill: DecodeStepModel | None = None,
) -> tuple[list[int], list[torch.Tensor]]:
    """Feed ``prompt``, then pick the argmax ``steps`` times.

    The prompt goes one token at a time through ``model`` (a decode step), or in full chunks
    through ``prefill`` (a sibling with query_length C; the remainder token by token). Returns the
    generated tokens and the logits [vocab] of every prompt and decode position but the last.
    Resets the cache first, so calls are independent.
    """
    if not prompt:
        raise ValueError("prompt must hold at least one token")
    if len(prompt) + steps - 1 > model.context:
        raise ValueError(f"{len(prompt)} + {steps} tokens exceed the context of {model.context}")
    model.reset_cache()
    host = HostCache(model) if model.kv == KVCache.input else None
    all_logits: list[torch.Tensor] = []
    position = 0
    if prefill is not None:
        chunk = prefill.query_length
        while len(prompt) - position >= chunk:
            logits = run_call(prefill, prompt[position : position + chunk], position, host)
            all_logits += [row.float() for row in logits]
            position += chunk
    generated: list[int] = []
    token = prompt[position] if position < len(prompt) else int(torch.argmax(all_logits[-1]))
    if position >= len(prompt):
        generated.append(token)
    while position < len(prompt) + steps - 1:
        logits = run_call(model, [token], position, host)[-1]
        all_logits.append(logits.float())
        position += 1
        if position < len(prompt):
            token = prompt[position]
        else:
            token = int(torch.argmax(logits))
            generated.append(token)
    return generated, all_logits


def parameter_count(model: nn.Module) -> int:
    return sum(math.prod(parameter.shape) for parameter in model.parameters())
