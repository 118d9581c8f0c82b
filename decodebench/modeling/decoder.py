"""The whole decoder of one call: embeddings, layers, final norm, logits; and its weights.

Inputs, in forward order:

- decode: ``input_ids`` [1, 1] int32, ``position`` [1] int32, ``causal_mask`` [1, 1, 1, context]
  (0 where a cache slot is visible, ``-inf`` elsewhere; see
  :func:`decodebench.modeling.host.causal_mask`), then with ``kv="input"`` the caches, keys and
  values interleaved by layer;
- prefill: ``input_ids`` [1, C], ``position`` [1] (the chunk holds positions
  ``position .. position+C-1``), then the caches with ``kv="input"``. The prefill mask is built in
  the graph from ``position``: the host needs nothing layout-specific, and in the folded layout
  it is built directly on the merged group x sequence axis (no ``tile``).

Output ``logits`` [1, C, vocab] (then the new K/V with ``kv="input"``).

``kv_window`` (``kv="state"``, decode only): a sliding layer's cache holds only its last
``W = min(sliding_window, context)`` keys and values, a ring written at slot ``position mod W``.
The ring holds exactly the keys the layer may see, in some order (softmax does not care, and RoPE
was applied before caching), so its mask is the first W columns of the causal mask: a slot is
seen once it has been written. The inputs are those of ``kv="state"``.

Module and parameter names follow Hugging Face (``model.layers.0.self_attn.q_proj.weight``, ...)
so a transformers checkpoint of the same shape loads with ``load_state_dict``.
"""

from __future__ import annotations

import zlib
from concurrent.futures import ThreadPoolExecutor

import torch
from torch import nn
from torch.nn import functional

from decodebench.contracts.domain import Attention, KVCache
from decodebench.contracts.presets import ModelConfig
from decodebench.modeling.attention import GroupedQueryAttention
from decodebench.modeling.families import family_for
from decodebench.modeling.kv_modes import kv_mode
from decodebench.modeling.layers import MLP, RMSNorm, rope_tables
from decodebench.modeling.layouts import layout_for

# Small enough that activations and logits stay well inside fp16 range at EXAONE width.
INIT_STD = 0.02
MASKED = float("-inf")
INIT_THREADS = 2


class DecoderLayer(nn.Module):
    """One layer; its family (:mod:`~decodebench.modeling.families`) decides its norms and how
    attention and MLP compose (pre-norm in Llama, each sub-block's output normalised in
    EXAONE 4). The attribute names are Hugging Face's."""

    def __init__(
        self,
        config: ModelConfig,
        attention: Attention,
        kv: KVCache,
        query_length: int,
        index: int = 0,
    ) -> None:
        super().__init__()
        self.family = family_for(config)
        self.self_attn = GroupedQueryAttention(config, attention, kv, query_length, index)
        self.mlp = MLP(config, self.family.activation)
        self.family.add_norms(self, config)

    def norm(self, name: str) -> nn.Module:
        """One of the norms the family gave this layer, by its Hugging Face name."""
        return self.get_submodule(name)

    def forward(
        self, hidden: torch.Tensor, *attention_args: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.family.layer_forward(self, hidden, *attention_args)


class DecoderBody(nn.Module):
    def __init__(
        self, config: ModelConfig, attention: Attention, kv: KVCache, query_length: int
    ) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            [
                DecoderLayer(config, attention, kv, query_length, index)
                for index in range(config.num_layers)
            ]
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


def parameter_seed(seed: int, name: str) -> int:
    """Each parameter has its own stream: its values depend on the seed and its name only."""
    return (seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63)


class DecodeStepModel(nn.Module):
    """One call of the whole model (decode step or prefill chunk); see the module docstring.
    Built in eval mode: it only ever runs for inference."""

    rope_cos: torch.Tensor
    rope_sin: torch.Tensor
    rope_cos_local: torch.Tensor
    rope_sin_local: torch.Tensor
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
        kv_window: bool = False,
    ) -> None:
        super().__init__()
        if not 1 <= query_length <= context:
            raise ValueError(f"query_length {query_length} must be 1..{context}")
        self.config = config
        self.context = context
        self.attention = Attention(attention)
        self.kv = KVCache(kv)
        self.kv_mode = kv_mode(self.kv)
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
        self.family = family_for(config)
        self.sliding = [self.family.sliding(config, index) for index in range(config.num_layers)]
        self.kv_window = kv_window
        self.cache_slots = self._cache_slots()
        cos, sin = rope_tables(config, context)
        self.register_buffer("rope_cos", cos.to(dtype), persistent=False)
        self.register_buffer("rope_sin", sin.to(dtype), persistent=False)
        if any(self.sliding):
            cos, sin = rope_tables(config, context, self.family.rope_theta(config, sliding=True))
            self.register_buffer("rope_cos_local", cos.to(dtype), persistent=False)
            self.register_buffer("rope_sin_local", sin.to(dtype), persistent=False)
        self._register_constants()
        self.kv_mode.register_caches(self)
        self.eval()

    def _cache_slots(self) -> list[int]:
        """Each layer's cache length: the context, or a sliding layer's window with kv_window."""
        if not self.kv_window:
            return [self.context] * self.config.num_layers
        if self.kv != KVCache.state or self.query_length != 1:
            raise ValueError("kv_window is a decode step with kv='state'")
        if not any(self.sliding):
            raise ValueError(f"kv_window: {self.config.name} has no sliding-window layers")
        window = min(self.config.sliding_window or self.context, self.context)
        return [window if sliding else self.context for sliding in self.sliding]

    def _register_constants(self) -> None:
        # Positions of the query rows relative to `position`: on the merged group x sequence axis
        # in the folded layout (row g*C + c is token c), one row per token otherwise.
        length = self.query_length
        rows = layout_for(self.attention, self.config, length).row_offsets()
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
            kv_window=self.kv_window,
        )
        self.kv_mode.share_caches(self, twin)
        return twin

    def cache_names(self) -> list[str]:
        """KV cache names (buffers or inputs), in layer order, keys and values interleaved."""
        names = []
        for index in range(self.config.num_layers):
            names += [f"key_cache_{index}", f"value_cache_{index}"]
        return names

    def cache_shape(self, index: int) -> tuple[int, int, int, int]:
        """Layer ``index``'s key (and value) cache shape [1, Hkv, slots, head_dim]."""
        config = self.config
        return (1, config.num_key_value_heads, self.cache_slots[index], config.head_dim)

    def sliding_cache_names(self) -> list[str]:
        """The caches of sliding-window layers (keys and values), in :meth:`cache_names` order."""
        names = self.cache_names()
        return [name for index, name in enumerate(names) if self.sliding[index // 2]]

    def new_kv_names(self) -> list[str]:
        """Output names of the new K/V with ``kv="input"``, in layer order."""
        names = []
        for index in range(self.config.num_layers):
            names += [f"key_{index}", f"value_{index}"]
        return names

    def caches(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``index``'s cache buffers (``kv="state"``)."""
        key_cache = getattr(self, f"key_cache_{index}")
        value_cache = getattr(self, f"value_cache_{index}")
        return key_cache, value_cache

    def reset_cache(self) -> None:
        self.kv_mode.reset_caches(self)

    def forward(
        self, input_ids: torch.Tensor, position: torch.Tensor, *rest: torch.Tensor
    ) -> torch.Tensor | tuple[torch.Tensor, ...]:
        rotary_dim, length = self.config.rotary_dim, self.query_length
        hidden = self.model.embed_tokens(input_ids)
        embed_scale = self.family.embed_scale(self.config)
        if embed_scale is not None:
            hidden = hidden * embed_scale  # in the compute dtype, as the reference does
        if length == 1:
            causal, caches = rest[0].to(hidden.dtype), rest[1:]
            positions = position
        else:
            caches = rest
            positions = position + self.token_offsets
            causal = self._prefill_mask(position)
        shape = (1, 1, length, rotary_dim)
        cos = torch.index_select(self.rope_cos, 0, positions).view(shape)
        sin = torch.index_select(self.rope_sin, 0, positions).view(shape)
        local = (cos, sin, causal)
        if any(self.sliding):
            local = (
                torch.index_select(self.rope_cos_local, 0, positions).view(shape),
                torch.index_select(self.rope_sin_local, 0, positions).view(shape),
                causal + self._window_mask(position),
            )
        new_mask = self.kv_mode.new_token_mask(self)
        new_kv: list[torch.Tensor] = []
        for index, layer in enumerate(self.model.layers):
            key_cache, value_cache = self.kv_mode.layer_caches(self, index, caches)
            layer_cos, layer_sin, mask = local if self.sliding[index] else (cos, sin, causal)
            slot, slots = position, self.cache_slots[index]
            if slots < self.context:  # a ring: the window's slots, written at position mod W
                slot, mask = position % slots, causal[..., :slots]
            hidden, key, value = layer(
                hidden, layer_cos, layer_sin, mask, slot, key_cache, value_cache, new_mask
            )
            new_kv += [key, value]
        hidden = self.model.norm(hidden)
        lm_head_weight = (
            self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        )
        # Tied: reuse the embedding parameter itself so the converted graph holds one copy.
        logits = functional.linear(hidden, lm_head_weight)
        cap = self.config.final_logit_softcapping
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return self.kv_mode.result(logits, new_kv)

    def _window_mask(self, position: torch.Tensor) -> torch.Tensor:
        """[1, 1, rows, context]: -inf on keys a sliding layer no longer sees (``window`` keys
        back from each query row, its own included), built in the graph from ``position``."""
        window = self.config.sliding_window or self.context
        row_positions = position + self.row_offsets
        far = self.key_positions[None, :] <= row_positions[:, None] - window
        mask = torch.zeros((self.query_rows, self.context), dtype=self.dtype)
        return mask.masked_fill(far, MASKED)[None, None]

    def _prefill_mask(self, position: torch.Tensor) -> torch.Tensor:
        """[1, 1, rows, context]: the cache slots each query row may see, from ``position``."""
        # Shapes as Python ints: traced tensor sizes would become shape arithmetic in the graph.
        visible, per_row = self.kv_mode.prefill_visible(self, position)
        shape = (self.query_rows if per_row else 1, self.context)
        mask = torch.zeros(shape, dtype=self.dtype).masked_fill(~visible, MASKED)
        return mask[None, None]


# A model is built for inference only, in eval mode from its construction.
build_model = DecodeStepModel
