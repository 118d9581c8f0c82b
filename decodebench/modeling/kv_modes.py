"""KV-cache modes: where the cache lives and how a call's new K and V join it.

- :class:`StateCache` (``kv="state"``): per-layer registered buffers ``key_cache_{i}`` /
  ``value_cache_{i}`` [1, Hkv, context, head_dim], written in place at ``position``; coremltools
  turns each into a Core ML state and each write into ``slice_update`` + a state write. Attention
  then reads the whole cache, the call's own slots included.
- :class:`InputCache` (``kv="input"``): the cache is read-only model input (same names and
  shapes); the call returns its K and V (``key_{i}`` / ``value_{i}`` [1, Hkv, C, head_dim]) and
  the host writes them. Attention covers the cache *and* the new tokens: scores over both are
  concatenated before one softmax, so no context-sized tensor is copied.

Per-layer buffers (instead of one [layers, ...] buffer) keep every layer's read a plain
``read_state``: slicing a layer out of a combined cache would add one more context-sized copy
per layer to the graph, the very kind of redundant traffic this project measures.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.nn import functional

from decodebench.contracts.domain import KVCache


@dataclass(frozen=True)
class AttentionCall:
    """What one layer's attention hands its KV mode: the call's query, key and value
    ([1, H, C, D], rotated), the layer's caches, the masks over the cache and among the call's
    own tokens, and the position of its first token."""

    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    caches: tuple[torch.Tensor, torch.Tensor]
    masks: tuple[torch.Tensor, torch.Tensor | None]
    position: torch.Tensor


class KVMode:
    kind: KVCache
    returns_new_kv: bool

    def visible_slots(self, position: int) -> int:
        """How many cache slots a decode step at ``position`` sees (the host's mask)."""
        raise NotImplementedError

    def attend(self, module: Any, call: AttentionCall) -> torch.Tensor:
        """The attention output [1, Hq, C, D] of the call's query over the cache and its K/V."""
        raise NotImplementedError

    def prefill_visible(self, model: Any, position: torch.Tensor) -> tuple[torch.Tensor, bool]:
        """Which cache slots each prefill row sees, and whether that differs per row."""
        raise NotImplementedError

    def result(
        self, logits: torch.Tensor, new_kv: Sequence[torch.Tensor]
    ) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """The model's output: logits, and the new K/V when the host keeps the cache."""
        raise NotImplementedError

    def split_output(self, output: Any) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The inverse of :meth:`result`: logits and the new K/V the host must write."""
        raise NotImplementedError

    def layer_caches(
        self, model: Any, index: int, inputs: Sequence[torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``index``'s key and value cache, from the model's buffers or its inputs."""
        raise NotImplementedError

    def new_token_mask(self, model: Any) -> torch.Tensor | None:
        """The causal mask among a call's own tokens, where they are attended separately."""
        return None

    def host_caches(self, model: Any) -> list[torch.Tensor]:
        """The cache tensors the host feeds in (none when the model keeps them)."""
        return []

    def register_caches(self, model: Any) -> None:
        """Give ``model`` its cache buffers, if it keeps them."""

    def share_caches(self, model: Any, twin: Any) -> None:
        """Make ``twin`` (another query length) use ``model``'s cache buffers."""

    def reset_caches(self, model: Any) -> None:
        """Zero the cache buffers ``model`` keeps."""


class StateCache(KVMode):
    kind = KVCache.state
    returns_new_kv = False

    def visible_slots(self, position: int) -> int:
        return position + 1  # the token's own slot is written first, so key 0 is always seen

    def attend(self, module: Any, call: AttentionCall) -> torch.Tensor:
        (key_cache, value_cache), position = call.caches, call.position
        length = module.query_length  # a Python int: a traced size would become graph arithmetic
        # In-place write of these tokens' K and V: becomes slice_update + a state write.
        key_cache[:, :, position : position + length, :] = call.key
        value_cache[:, :, position : position + length, :] = call.value
        return module.attend_cache(call.query, key_cache, value_cache, call.masks[0])

    def prefill_visible(self, model: Any, position: torch.Tensor) -> tuple[torch.Tensor, bool]:
        # Slots up to the row's own position (this call's tokens are written first).
        row_positions = position + model.row_offsets
        return model.key_positions[None, :] <= row_positions[:, None], True

    def result(
        self, logits: torch.Tensor, new_kv: Sequence[torch.Tensor]
    ) -> torch.Tensor | tuple[torch.Tensor, ...]:
        return logits

    def split_output(self, output: Any) -> tuple[torch.Tensor, list[torch.Tensor]]:
        return output, []

    def layer_caches(
        self, model: Any, index: int, inputs: Sequence[torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return model.caches(index)

    def register_caches(self, model: Any) -> None:
        for number, name in enumerate(model.cache_names()):
            shape = model.cache_shape(number // 2)
            model.register_buffer(name, torch.zeros(shape, dtype=model.dtype), persistent=False)

    def share_caches(self, model: Any, twin: Any) -> None:
        for name in model.cache_names():
            setattr(twin, name, getattr(model, name))

    def reset_caches(self, model: Any) -> None:
        for name in model.cache_names():
            getattr(model, name).zero_()


class InputCache(KVMode):
    kind = KVCache.input
    returns_new_kv = True

    def visible_slots(self, position: int) -> int:
        return position  # the new token is attended separately

    def attend(self, module: Any, call: AttentionCall) -> torch.Tensor:
        """One softmax over [cache scores | new scores]: exact, and the only concatenation is of
        scores, never of the context-sized K/V."""
        # The call's position is not used: the host writes the new K/V after the call.
        layout, (cache_mask, new_mask), query = module.layout, call.masks, call.query
        rows = layout.rows(query)
        key_cache, value_cache = (layout.heads(cache) for cache in call.caches)
        key, value = layout.heads(call.key), layout.heads(call.value)
        cache_scores = module.scores(rows, key_cache) + cache_mask
        new_scores = module.scores(rows, key)
        if new_mask is not None:
            new_scores = new_scores + new_mask
        scores = torch.cat((cache_scores, new_scores), dim=-1)
        probabilities = functional.softmax(scores.float(), dim=-1).to(query.dtype)
        context_length = key_cache.shape[2]
        context = torch.matmul(probabilities[..., :context_length], value_cache) + torch.matmul(
            probabilities[..., context_length:], value
        )
        return layout.unrows(context)

    def prefill_visible(self, model: Any, position: torch.Tensor) -> tuple[torch.Tensor, bool]:
        # Only what the host cached before this call; the new tokens come separately.
        return (model.key_positions < position)[None, :], False

    def result(
        self, logits: torch.Tensor, new_kv: Sequence[torch.Tensor]
    ) -> torch.Tensor | tuple[torch.Tensor, ...]:
        return (logits, *new_kv)

    def split_output(self, output: Any) -> tuple[torch.Tensor, list[torch.Tensor]]:
        logits, *new_kv = output
        return logits, new_kv

    def layer_caches(
        self, model: Any, index: int, inputs: Sequence[torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return inputs[2 * index], inputs[2 * index + 1]

    def new_token_mask(self, model: Any) -> torch.Tensor | None:
        return model.new_token_mask if model.query_length > 1 else None

    def host_caches(self, model: Any) -> list[torch.Tensor]:
        return [
            torch.zeros(model.cache_shape(number // 2), dtype=model.dtype)
            for number, _ in enumerate(model.cache_names())
        ]


KV_MODES: dict[KVCache, KVMode] = {KVCache.state: StateCache(), KVCache.input: InputCache()}


def kv_mode(kv: KVCache | str) -> KVMode:
    return KV_MODES[KVCache(kv)]
