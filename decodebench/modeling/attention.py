"""Grouped-query attention of one call, composed from a layout and a KV mode (no branches)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional

from decodebench.contracts.domain import Attention, KVCache
from decodebench.contracts.presets import ModelConfig
from decodebench.modeling.families import family_for
from decodebench.modeling.kv_modes import AttentionCall, kv_mode
from decodebench.modeling.layers import RMSNorm, Rotary, rotary_for
from decodebench.modeling.layouts import AttentionLayout, layout_for


def _layout_method(kind: Attention, doc: str) -> Callable[..., torch.Tensor]:
    """The method attending over the whole cache in layout ``kind``, named after it."""

    def attend(
        self: GroupedQueryAttention,
        query: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        causal_mask: torch.Tensor,
    ) -> torch.Tensor:
        layout = self.layouts[kind]
        return self._in_layout(layout, query, key_cache, value_cache, causal_mask)

    attend.__name__ = attend.__qualname__ = kind.value
    attend.__doc__ = doc
    return attend


class GroupedQueryAttention(nn.Module):
    def __init__(
        self,
        config: ModelConfig,
        attention: Attention,
        kv: KVCache = KVCache.state,
        query_length: int = 1,
        index: int = 0,
    ) -> None:
        super().__init__()
        family = family_for(config)
        self.config = config
        self.attention = Attention(attention)
        self.kv = KVCache(kv)
        self.layouts = {kind: layout_for(kind, config, query_length) for kind in Attention}
        self.layout = self.layouts[self.attention]
        self.kv_mode = kv_mode(self.kv)
        self.query_length = query_length
        self.query_heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.group_size = config.group_size
        self.head_dim = config.head_dim
        self.scale = (config.query_pre_attn_scalar or config.head_dim) ** -0.5
        hidden, head_dim = config.hidden_size, config.head_dim
        bias = family.attention_bias
        self.q_proj = nn.Linear(hidden, self.query_heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden, self.kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden, self.kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(self.query_heads * head_dim, hidden, bias=False)
        self.rotary: Rotary = rotary_for(family.rotary(config, index), head_dim, config.rotary_dim)
        self.qk_norm = family.qk_norm
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
        query, key = self.rotary(query, cos, sin), self.rotary(key, cos, sin)

        caches, masks = (key_cache, value_cache), (mask, new_mask)
        context = self.kv_mode.attend(
            self, AttentionCall(query, key, value, caches, masks, position)
        )
        # [1, Hq, C, D] -> [1, C, Hq * D]
        context = context.transpose(1, 2).reshape(1, length, self.query_heads * head_dim)
        # A no-op in torch, but traced: coremltools reads states and fp16 inputs as fp32, so without
        # it o_proj's weight is promoted to an fp32 copy (then cast back to another fp16 copy,
        # ~0.75 GB and 2 s at EXAONE size). The fp16 pass removes the cast again.
        context = context.to(self.o_proj.weight.dtype)
        return self.o_proj(context), key, value

    def attend_cache(
        self,
        query: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        causal_mask: torch.Tensor,
    ) -> torch.Tensor:
        """Attention over the whole cache in this module's layout.

        Looked up by the layout's name (``repeat_kv`` / ``folded``), so a test can swap one
        layout's method for a deliberately different head mapping.
        """
        method = getattr(self, self.attention.value)
        return method(query, key_cache, value_cache, causal_mask)

    def _attend(
        self,
        rows: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        causal_mask: torch.Tensor,
    ) -> torch.Tensor:
        """softmax(rows keys^T * scale + mask) values, for rows and K/V already laid out."""
        # Every op between the two matmuls works row by row over the key axis, which is what
        # makes the query fold exact.
        scores = self.scores(rows, keys) + causal_mask
        probabilities = functional.softmax(scores.float(), dim=-1).to(rows.dtype)
        return torch.matmul(probabilities, values)

    def scores(self, rows: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """rows keys^T * scale (both KV modes score through here)."""
        return torch.matmul(rows, keys.transpose(-1, -2)) * self.scale

    def _in_layout(
        self,
        layout: AttentionLayout,
        query: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        causal_mask: torch.Tensor,
    ) -> torch.Tensor:
        rows = layout.rows(query)
        context = self._attend(
            rows, layout.heads(key_cache), layout.heads(value_cache), causal_mask
        )
        return layout.unrows(context)

    repeat_kv = _layout_method(
        Attention.repeat_kv,
        "The reference layout: replicate each KV head G times (query head h reads KV h // G).",
    )
    folded = _layout_method(
        Attention.folded,
        "Fold the query instead: [1, Hq, C, D] -> [1, Hkv, G*C, D], a pure reshape.",
    )
