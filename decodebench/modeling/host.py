"""The host's side of a decode step: masks, inputs, the ``kv="input"`` cache, greedy decoding.

These drive a :class:`~decodebench.modeling.decoder.DecodeStepModel` in PyTorch the way the
device harness drives its converted package.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from decodebench.contracts.domain import KVCache
from decodebench.modeling.decoder import MASKED, DecodeStepModel
from decodebench.modeling.kv_modes import kv_mode


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
    visible = kv_mode(kv).visible_slots(position)
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
    """The host's side of ``kv="input"``: the cache arrays, and writing each call's new K/V.

    Empty with ``kv="state"`` (the model keeps its cache), so callers need not tell the modes
    apart.
    """

    def __init__(self, model: DecodeStepModel) -> None:
        self.tensors = model.kv_mode.host_caches(model)

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
    if host is None:
        if model.kv_mode.returns_new_kv:
            raise ValueError(f"kv={model.kv.value!r} needs the HostCache of earlier calls")
        host = HostCache(model)
    output = model(*inputs, *host.tensors)
    logits, new_kv = model.kv_mode.split_output(output)
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
    host = HostCache(model)
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
