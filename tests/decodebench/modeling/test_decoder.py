"""The PyTorch decoder: the fold is exact, and the model matches Hugging Face's."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional

from decodebench.contracts.domain import Attention
from decodebench.contracts.presets import TINY_GQA, ModelConfig
from decodebench.modeling import (
    GroupedQueryAttention,
    build_model,
    causal_mask,
    greedy_decode,
    parameter_count,
    step_inputs,
)

CONTEXT = 64
PROMPT = [1, 17, 42, 7]


def test_repeat_kv_and_folded_agree_token_for_token() -> None:
    repeated = build_model(TINY_GQA, CONTEXT, Attention.repeat_kv)
    folded = build_model(TINY_GQA, CONTEXT, Attention.folded)
    repeated_tokens, repeated_logits = greedy_decode(repeated, PROMPT, 16)
    folded_tokens, folded_logits = greedy_decode(folded, PROMPT, 16)

    assert len(repeated_tokens) == 16
    assert repeated_tokens == folded_tokens
    for left, right in zip(repeated_logits, folded_logits, strict=True):
        assert torch.isfinite(left).all()
        torch.testing.assert_close(left, right, rtol=1e-5, atol=1e-5)
    # Random weights that collapse to one token would make the comparison meaningless.
    assert len(set(repeated_tokens)) > 1


def _tiny_attention(query_heads: int, kv_heads: int, head_dim: int) -> GroupedQueryAttention:
    config = ModelConfig(
        name="hand-made",
        family="llama",
        num_layers=1,
        hidden_size=8,
        intermediate_size=8,
        vocab_size=2,
        num_attention_heads=query_heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
    )
    return GroupedQueryAttention(config, Attention.folded)


def test_fold_is_exact_on_a_hand_made_case() -> None:
    # Hq = 4 over Hkv = 2 (G = 2), head_dim 2, 3 cached keys of which 2 are visible.
    attention = _tiny_attention(query_heads=4, kv_heads=2, head_dim=2)
    query = torch.tensor([[[[1.0, 0.0]], [[0.0, 1.0]], [[1.0, 1.0]], [[-1.0, 2.0]]]])
    keys = torch.tensor(
        [[[[1.0, 0.0], [0.0, 1.0], [5.0, 5.0]], [[2.0, 1.0], [1.0, -1.0], [9.0, 9.0]]]]
    )
    values = torch.tensor(
        [[[[1.0, 2.0], [3.0, 4.0], [99.0, 99.0]], [[5.0, 6.0], [7.0, 8.0], [99.0, 99.0]]]]
    )
    mask = torch.tensor([[[[0.0, 0.0, float("-inf")]]]])

    # The definition, head by head: query head h reads KV head h // G.
    expected = torch.empty(1, 4, 1, 2)
    for head in range(4):
        kv_head = head // 2
        scores = query[0, head, 0] @ keys[0, kv_head].T * 2**-0.5 + mask[0, 0, 0]
        expected[0, head, 0] = functional.softmax(scores, dim=-1) @ values[0, kv_head]

    folded = attention.folded(query, keys, values, mask)
    repeated = attention.repeat_kv(query, keys, values, mask)
    torch.testing.assert_close(folded, expected)
    torch.testing.assert_close(repeated, expected)
    assert torch.equal(folded, repeated)

    # The other head mapping (h % Hkv, what x.repeat(1, G, 1, 1) gives) is not what we fold.
    other_mapping = attention._attend(
        query, keys.repeat(1, 2, 1, 1), values.repeat(1, 2, 1, 1), mask
    )
    assert not torch.allclose(other_mapping, expected)


def test_step_writes_only_its_position_of_the_cache() -> None:
    model = build_model(TINY_GQA, CONTEXT, Attention.folded)
    with torch.no_grad():
        model(*step_inputs(token=5, position=9, context=CONTEXT))
    key_cache, value_cache = model.caches(0)
    written = key_cache.abs().sum(dim=(0, 1, 3)) > 0
    assert written.nonzero().flatten().tolist() == [9]
    assert (value_cache.abs().sum(dim=(0, 1, 3)) > 0).nonzero().flatten().tolist() == [9]
    model.reset_cache()
    assert int(model.caches(0)[0].count_nonzero()) == 0


def test_same_seed_same_weights_in_either_dtype() -> None:
    fp32 = build_model(TINY_GQA, CONTEXT, Attention.repeat_kv)
    fp16 = build_model(TINY_GQA, CONTEXT, Attention.folded, torch.float16)
    for (name, left), (_, right) in zip(
        fp32.named_parameters(), fp16.named_parameters(), strict=True
    ):
        assert right.dtype == torch.float16, name
        assert torch.equal(left.half(), right), name
    assert parameter_count(fp32) == parameter_count(fp16)
    other_seed = build_model(TINY_GQA.model_copy(update={"seed": 1}), CONTEXT)
    assert not torch.equal(other_seed.model.embed_tokens.weight, fp32.model.embed_tokens.weight)


def test_causal_mask_and_decode_limits() -> None:
    mask = causal_mask(2, 5)
    assert mask.shape == (1, 1, 1, 5)
    assert mask.flatten().tolist()[:3] == [0.0, 0.0, 0.0]
    assert torch.isinf(mask.flatten()[3:]).all()
    with pytest.raises(ValueError, match="outside the context"):
        causal_mask(5, 5)
    model = build_model(TINY_GQA, CONTEXT)
    with pytest.raises(ValueError, match="exceed the context"):
        greedy_decode(model, PROMPT, CONTEXT)


def test_weights_depend_on_seed_and_name_only() -> None:
    # A parameter's values do not move when the model around it changes shape.
    two_layers = build_model(TINY_GQA, CONTEXT)
    one_layer = build_model(TINY_GQA.model_copy(update={"num_layers": 1}), CONTEXT)
    for name, parameter in one_layer.named_parameters():
        assert torch.equal(parameter, two_layers.get_parameter(name)), name


def test_sibling_shares_weights_and_state() -> None:
    decode = build_model(TINY_GQA, CONTEXT)
    prefill = decode.sibling(4)
    assert prefill.query_length == 4
    for (name, left), (_, right) in zip(
        decode.named_parameters(), prefill.named_parameters(), strict=True
    ):
        assert left.data_ptr() == right.data_ptr(), name
    assert decode.caches(0)[0].data_ptr() == prefill.caches(0)[0].data_ptr()


def test_kv_input_mask_hides_the_new_tokens_own_slot() -> None:
    state_mask = causal_mask(3, 8, kv="state")
    input_mask = causal_mask(3, 8, kv="input")
    assert (state_mask[0, 0, 0] == 0).sum() == 4
    assert (input_mask[0, 0, 0] == 0).sum() == 3
