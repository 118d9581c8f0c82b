"""The decoder against Hugging Face transformers' own implementation of each family.

Same weights (ours, loaded into the reference), same tokens: logits within fp32 tolerance at every
position and identical greedy tokens for 32 decode steps, for both attention layouts, both KV
handlings, and a prefill chunk in front of decode.
"""

from __future__ import annotations

import pytest
import torch

from decodebench.building.weights import hf_config_dict
from decodebench.contracts.domain import Attention, KVCache
from decodebench.contracts.presets import TINY_EXAONE, TINY_GQA, TINY_LLAMA, TINY_QWEN, ModelConfig
from decodebench.modeling import build_model, greedy_decode

transformers = pytest.importorskip("transformers")

CONTEXT = 64
PROMPT = [1, 17, 42, 7, 99, 3, 250, 11]
STEPS = 32
REFERENCE_CLASSES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "exaone4": ("Exaone4Config", "Exaone4ForCausalLM"),
}
FAMILY_PRESETS = [TINY_LLAMA, TINY_QWEN, TINY_EXAONE, TINY_GQA]
# The presets' small init makes tied tiny models echo their input token forever; larger weights
# give varied greedy paths, so "identical tokens" means something.
WEIGHT_SCALE = 4.0


def oracle_model(
    config: ModelConfig, attention: Attention = Attention.folded, kv: KVCache = KVCache.state
) -> torch.nn.Module:
    model = build_model(config, CONTEXT, attention, kv=kv)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if not name.endswith("norm.weight"):
                parameter.mul_(WEIGHT_SCALE)
    return model


def hf_reference(config: ModelConfig, state: dict[str, torch.Tensor]) -> torch.nn.Module:
    config_class, model_class = REFERENCE_CLASSES[config.family]
    fields = hf_config_dict(config, max_position_embeddings=CONTEXT)
    fields.pop("architectures")
    fields.pop("model_type")
    hf_config = getattr(transformers, config_class)(**fields, eos_token_id=None, pad_token_id=0)
    reference = getattr(transformers, model_class)(hf_config).eval()
    missing, unexpected = reference.load_state_dict(state, strict=False)
    assert unexpected == []
    assert set(missing) <= {"lm_head.weight"} and config.tie_word_embeddings == bool(missing)
    return reference


@pytest.fixture(scope="module", params=FAMILY_PRESETS, ids=lambda config: config.name)
def oracle(request: pytest.FixtureRequest) -> tuple[ModelConfig, list[int], torch.Tensor]:
    """Per family: the reference's 32 greedy tokens and its logits along prompt + tokens."""
    config: ModelConfig = request.param
    ours = oracle_model(config)
    reference = hf_reference(config, ours.state_dict())
    with torch.no_grad():
        generated = reference.generate(
            torch.tensor([PROMPT]), max_new_tokens=STEPS, do_sample=False, min_new_tokens=STEPS
        )[0, len(PROMPT) :].tolist()
        logits = reference(torch.tensor([PROMPT + generated[:-1]])).logits[0]
    # Random weights that collapse to one token would make the comparison meaningless.
    assert len(set(generated)) > 3
    return config, generated, logits


@pytest.mark.parametrize("attention", list(Attention))
@pytest.mark.parametrize("kv", list(KVCache))
def test_decoder_matches_transformers(
    oracle: tuple[ModelConfig, list[int], torch.Tensor], attention: Attention, kv: KVCache
) -> None:
    config, expected_tokens, expected_logits = oracle
    model = oracle_model(config, attention, kv)
    tokens, logits = greedy_decode(model, PROMPT, STEPS)
    assert tokens == expected_tokens
    torch.testing.assert_close(torch.stack(logits), expected_logits, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("attention", list(Attention))
@pytest.mark.parametrize("kv", list(KVCache))
def test_prefill_chunks_match_transformers(
    oracle: tuple[ModelConfig, list[int], torch.Tensor], attention: Attention, kv: KVCache
) -> None:
    config, expected_tokens, expected_logits = oracle
    model = oracle_model(config, attention, kv)
    # Chunks of 3 over 8 prompt tokens: two prefill calls, then decode steps from position 6.
    tokens, logits = greedy_decode(model, PROMPT, STEPS, prefill=model.sibling(3))
    assert tokens == expected_tokens
    torch.testing.assert_close(torch.stack(logits), expected_logits, rtol=1e-4, atol=1e-4)


def test_llama3_rope_scaling_changes_the_numbers() -> None:
    # The tiny Llama's scaling must actually move some frequencies, or the oracle proves nothing.
    from decodebench.modeling import inverse_frequencies

    unscaled = TINY_LLAMA.model_copy(update={"rope_scaling": None})
    scaled, plain = inverse_frequencies(TINY_LLAMA), inverse_frequencies(unscaled)
    changed = (scaled != plain).nonzero().flatten().tolist()
    kept = (scaled == plain).nonzero().flatten().tolist()
    assert changed and kept
    blended = [i for i in changed if not torch.isclose(scaled[i], plain[i] / 8)]
    assert blended, "no frequency falls in the smoothed band"
