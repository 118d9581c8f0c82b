"""Qwen3: per-head q/k RMSNorm before RoPE, head_dim apart from hidden / heads, tied
embeddings, no q/k/v bias; a transformers checkpoint builds in fp16 and decodes its tokens."""

from __future__ import annotations

from pathlib import Path

import pytest

from decodebench.building.weights import WeightsError, expected_shapes, model_config_from_hf
from tests.support.families import check_packages, check_pytorch_decoder, tiny_checkpoint

CONTEXT = 64
PROMPT = [5, 9, 200, 31, 77, 4, 180, 23, 64, 130, 2, 99, 41, 250, 8, 17]
STEPS = 12
SEED = 0
FIELDS = {
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,  # 4 heads x 32 = 128, twice hidden: head_dim is its own figure
    "tie_word_embeddings": True,
    "rope_theta": 10_000.0,
    "max_position_embeddings": CONTEXT,
    "initializer_range": 0.3,
}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("qwen3") / "tiny-qwen3"
    return tiny_checkpoint(root, "Qwen3Config", "Qwen3ForCausalLM", FIELDS, SEED)


def test_config_and_tensors(folder: Path) -> None:
    import json

    config = model_config_from_hf(json.loads((folder / "config.json").read_text()), "q")
    assert (config.family, config.head_dim, config.tie_word_embeddings) == ("qwen3", 32, True)
    shapes = expected_shapes(config)
    assert shapes["model.layers.0.self_attn.q_norm.weight"] == (32,)
    assert shapes["model.layers.0.self_attn.q_proj.weight"] == (128, 64)
    assert not any(name.endswith("proj.bias") for name in shapes)
    assert "lm_head.weight" not in shapes


def test_biases_and_sliding_window_are_refused(folder: Path) -> None:
    import json

    raw = json.loads((folder / "config.json").read_text())
    with pytest.raises(WeightsError, match="attention_bias=True"):
        model_config_from_hf({**raw, "attention_bias": True}, "q")
    with pytest.raises(WeightsError, match="use_sliding_window=True"):
        model_config_from_hf({**raw, "use_sliding_window": True}, "q")


def test_pytorch_decoder_matches_transformers(folder: Path) -> None:
    check_pytorch_decoder(folder, PROMPT, STEPS, CONTEXT)


@pytest.mark.slow
def test_fp16_packages_decode_the_fp32_tokens(folder: Path, tmp_path: Path) -> None:
    check_packages(folder, PROMPT, STEPS, CONTEXT, tmp_path)
