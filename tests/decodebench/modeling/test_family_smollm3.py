"""SmolLM3: every ``no_rope_layer_interval``-th layer attends without RoPE, tied embeddings; a
transformers checkpoint builds in fp16 and decodes its tokens."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from decodebench.building.weights import WeightsError, model_config_from_hf
from tests.support.families import check_packages, check_pytorch_decoder, tiny_checkpoint

CONTEXT = 64
PROMPT = [5, 9, 200, 31, 77, 4, 180, 23, 64, 130, 2, 99, 41, 250, 8, 17]
STEPS = 12
SEED = 1
FIELDS = {
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "no_rope_layer_interval": 3,  # the third layer attends without positions
    "tie_word_embeddings": True,
    "rope_theta": 10_000.0,
    "max_position_embeddings": CONTEXT,
    "initializer_range": 0.3,
}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("smollm3") / "tiny-smollm3"
    return tiny_checkpoint(root, "SmolLM3Config", "SmolLM3ForCausalLM", FIELDS, SEED)


def test_rope_layers_from_the_interval_or_the_list(folder: Path) -> None:
    raw = json.loads((folder / "config.json").read_text())
    assert model_config_from_hf(raw, "s").no_rope_layers == (1, 1, 0)
    del raw["no_rope_layers"]
    assert model_config_from_hf(raw, "s").no_rope_layers == (1, 1, 0)
    raw["no_rope_layer_interval"] = 2
    assert model_config_from_hf(raw, "s").no_rope_layers == (1, 0, 1)
    with pytest.raises(WeightsError, match="no_rope_layers must hold 3 flags"):
        model_config_from_hf({**raw, "no_rope_layers": [1, 0]}, "s")


def test_the_nope_layer_matters(folder: Path) -> None:
    """Rotating every layer changes the numbers, so the test below proves the NoPE layer."""
    import torch

    from decodebench.building.weights import load_checkpoint
    from decodebench.modeling import build_model, greedy_decode

    config, tensors = load_checkpoint(folder, dtype=torch.float32)
    everywhere = config.model_copy(update={"no_rope_layers": None})
    _, nope = greedy_decode(build_model(config, CONTEXT, weights=tensors), PROMPT, 2)
    _, rope = greedy_decode(build_model(everywhere, CONTEXT, weights=tensors), PROMPT, 2)
    assert not torch.allclose(torch.stack(nope), torch.stack(rope), atol=1e-2)


def test_pytorch_decoder_matches_transformers(folder: Path) -> None:
    check_pytorch_decoder(folder, PROMPT, STEPS, CONTEXT)


@pytest.mark.slow
def test_fp16_packages_decode_the_fp32_tokens(folder: Path, tmp_path: Path) -> None:
    check_packages(folder, PROMPT, STEPS, CONTEXT, tmp_path)
