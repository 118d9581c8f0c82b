"""The upload header checks know each family's tensors and shapes: a checkpoint of each family
passes, and a tensor it lacks, holds misshapen or does not use is named (from the safetensors
header alone: the server checks uploads without torch)."""

from __future__ import annotations

import io
import json

import pytest
import torch
from safetensors.torch import save

from decodebench.building.weights import expected_shapes, hf_config_dict
from decodebench.contracts.presets import PRESETS, ModelConfig
from decodebench.modelfiles import ModelFileError, check_hf_checkpoint

SMALL = {
    "hidden_size": 32,
    "intermediate_size": 48,
    "vocab_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "num_layers": 2,
}
# One preset of each family, cut small (same family details); Phi-3 rotates 12 of 16 dimensions.
FAMILY_PRESETS = {
    "llama": "llama-3.2-1b",
    "qwen2": "qwen2.5-0.5b",
    "qwen3": "qwen3-0.6b",
    "smollm3": "smollm3-3b",
    "phi3": "phi-4-mini",
    "gemma3": "gemma-3-270m",
    "exaone4": "exaone-4.0-1.2b",
}
# What each family needs that a Llama checkpoint does not have (or has otherwise).
OWN_TENSORS = {
    "qwen2": "model.layers.1.self_attn.k_proj.bias",
    "qwen3": "model.layers.1.self_attn.q_norm.weight",
    "exaone4": "model.layers.0.post_feedforward_layernorm.weight",
    "phi3": "model.layers.0.self_attn.qkv_proj.weight",
    "gemma3": "model.layers.1.pre_feedforward_layernorm.weight",
}


def _small(family: str) -> ModelConfig:
    preset = PRESETS[FAMILY_PRESETS[family]]
    update: dict[str, object] = {**SMALL, "name": f"small-{family}"}
    for field in ("sliding_layers", "no_rope_layers"):
        flags = getattr(preset, field)
        if flags is not None:
            update[field] = flags[: SMALL["num_layers"]]
    return preset.model_copy(update=update)


def _check(config: ModelConfig, tensors: dict[str, torch.Tensor]) -> dict:
    data = save(tensors)
    text = json.dumps(hf_config_dict(config)).encode()
    return check_hf_checkpoint(text, {"model.safetensors": (io.BytesIO(data), len(data))})


def _tensors(config: ModelConfig) -> dict[str, torch.Tensor]:
    return {name: torch.zeros(shape) for name, shape in expected_shapes(config).items()}


@pytest.mark.parametrize("family", sorted(FAMILY_PRESETS))
def test_each_family_checkpoint_passes_with_its_own_tensors(family: str) -> None:
    config = _small(family)
    summary = _check(config, _tensors(config))
    assert summary["family"] == family
    assert summary["parameters"] == sum(t.numel() for t in _tensors(config).values())


@pytest.mark.parametrize("family", sorted(OWN_TENSORS))
def test_a_missing_family_tensor_is_named(family: str) -> None:
    config = _small(family)
    tensors = _tensors(config)
    del tensors[OWN_TENSORS[family]]
    with pytest.raises(ModelFileError, match=f"tensor {OWN_TENSORS[family]} is missing"):
        _check(config, tensors)


@pytest.mark.parametrize("family", sorted(OWN_TENSORS))
def test_a_misshapen_family_tensor_is_named(family: str) -> None:
    config = _small(family)
    tensors = _tensors(config)
    name = OWN_TENSORS[family]
    expected = tuple(tensors[name].shape)
    tensors[name] = torch.zeros((expected[0] + 1, *expected[1:]))
    wrong = (expected[0] + 1, *expected[1:])
    with pytest.raises(ModelFileError) as refused:
        _check(config, tensors)
    assert f"tensor {name}: shape {wrong}, expected {expected}" in str(refused.value)


def test_a_tensor_of_another_family_is_named() -> None:
    """Split q/k/v in a Phi-3 checkpoint, a Qwen3 q_norm in a Llama one: not what it uses."""
    phi3, llama = _small("phi3"), _small("llama")
    split = {**_tensors(phi3), **{
        name: tensor for name, tensor in _tensors(llama).items() if "q_proj" in name
    }}  # fmt: skip
    with pytest.raises(ModelFileError, match="q_proj.weight: unexpected for a phi3 checkpoint"):
        _check(phi3, split)
    norm = {**_tensors(llama), "model.layers.0.self_attn.q_norm.weight": torch.zeros(16)}
    with pytest.raises(ModelFileError, match="q_norm.weight: unexpected for a llama checkpoint"):
        _check(llama, norm)
