"""Attention layouts: how the query rows meet the KV heads (the axis this project measures).

Both layouts compute the same attention; they differ in which tensor is reshaped:

- :class:`RepeatKV`, the reference: each KV head is replicated G times so query head h reads KV
  head h // G. ``expand`` + ``reshape`` of a stride-0 view copies; in MIL it becomes one
  ``tile`` op per K and V tensor, of the whole context.
- :class:`Folded`: the query is folded instead, [1, Hq, C, D] -> [1, Hkv, G*C, D], a pure
  reshape. At C = 1 the rows of KV head kv are its G query heads; at C > 1 the group and
  sequence axes merge (rank 4 kept), so masks are laid out on that merged axis too.
"""

from __future__ import annotations

import torch

from decodebench.contracts.domain import Attention
from decodebench.contracts.presets import ModelConfig


class AttentionLayout:
    """Where the query rows and K/V of one attention call sit; subclasses choose."""

    kind: Attention

    def __init__(self, config: ModelConfig, query_length: int) -> None:
        self.query_heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.group_size = config.group_size
        self.head_dim = config.head_dim
        self.query_length = query_length

    def rows(self, query: torch.Tensor) -> torch.Tensor:
        """The query [1, Hq, C, D] as the rows that meet ``heads`` of K/V."""
        raise NotImplementedError

    def heads(self, tensor: torch.Tensor) -> torch.Tensor:
        """A K or V tensor [1, Hkv, T, D] as the rows read it."""
        raise NotImplementedError

    def unrows(self, context: torch.Tensor) -> torch.Tensor:
        """The attention output of the rows back to [1, Hq, C, D]."""
        raise NotImplementedError

    def row_offsets(self) -> torch.Tensor:
        """Each query row's token, relative to the call's first position."""
        raise NotImplementedError


class RepeatKV(AttentionLayout):
    kind = Attention.repeat_kv

    def rows(self, query: torch.Tensor) -> torch.Tensor:
        return query

    def heads(self, tensor: torch.Tensor) -> torch.Tensor:
        """[1, Hkv, T, D] -> [1, Hq, T, D], KV head h // G for query head h (a tile in MIL)."""
        length = tensor.shape[2]
        shape = (1, self.kv_heads, self.group_size, length, self.head_dim)
        replicated = (1, self.query_heads, length, self.head_dim)
        return tensor[:, :, None, :, :].expand(shape).reshape(replicated)

    def unrows(self, context: torch.Tensor) -> torch.Tensor:
        return context

    def row_offsets(self) -> torch.Tensor:
        return torch.arange(self.query_length, dtype=torch.int32)


class Folded(AttentionLayout):
    kind = Attention.folded

    def rows(self, query: torch.Tensor) -> torch.Tensor:
        """[1, Hq, C, D] -> [1, Hkv, G*C, D]: row g*C + c of KV head kv is query head G*kv + g."""
        return query.reshape(1, self.kv_heads, self.group_size * self.query_length, self.head_dim)

    def heads(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def unrows(self, context: torch.Tensor) -> torch.Tensor:
        return context.reshape(1, self.query_heads, self.query_length, self.head_dim)

    def row_offsets(self) -> torch.Tensor:
        # On the merged group x sequence axis, row g*C + c is token c.
        return torch.arange(self.query_length, dtype=torch.int32).repeat(self.group_size)


LAYOUTS: dict[Attention, type[AttentionLayout]] = {
    Attention.repeat_kv: RepeatKV,
    Attention.folded: Folded,
}


def layout_for(attention: Attention, config: ModelConfig, query_length: int) -> AttentionLayout:
    return LAYOUTS[Attention(attention)](config, query_length)
