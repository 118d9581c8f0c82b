"""Phi-3 / Phi-4-mini: fused qkv_proj and gate_up_proj, partial rotary, LongRoPE; a transformers
checkpoint builds in fp16 and decodes its tokens."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from decodebench.building.weights import WeightsError, expected_shapes, model_config_from_hf
from decodebench.contracts.presets import LongRopeScaling
from tests.support.families import check_packages, check_pytorch_decoder, tiny_checkpoint

CONTEXT = 64
PROMPT = [5, 9, 200, 31, 77, 4, 180, 23, 64, 130, 2, 99, 41, 250, 8, 17]
STEPS = 12
SEED = 0
SHORT = [1.0, 1.25, 1.5, 2.0, 3.0, 4.0]
LONG = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0]
FIELDS = {
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "tie_word_embeddings": True,
    "max_position_embeddings": 4 * CONTEXT,
    "original_max_position_embeddings": CONTEXT,
    "rope_parameters": {
        "rope_type": "longrope",
        "rope_theta": 10_000.0,
        "partial_rotary_factor": 0.75,  # Phi-4-mini's: 12 of head_dim 16 rotate here
        "short_factor": SHORT,
        "long_factor": LONG,
    },
    # Without q/k norms, larger weights make attention so sharp that fp16 rounding of a score
    # moves whole logits; 0.2 keeps a varied path with wide margins.
    "initializer_range": 0.2,
}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("phi3") / "tiny-phi3"
    return tiny_checkpoint(root, "Phi3Config", "Phi3ForCausalLM", FIELDS, SEED)


def test_config_and_fused_tensors(folder: Path) -> None:
    config = model_config_from_hf(json.loads((folder / "config.json").read_text()), "p")
    assert (config.family, config.head_dim, config.rotary_dim) == ("phi3", 16, 12)
    scaling = config.rope_scaling
    assert isinstance(scaling, LongRopeScaling)
    assert scaling.short_factor == tuple(SHORT) and scaling.long_factor == tuple(LONG)
    assert scaling.attention_factor == pytest.approx(math.sqrt(1 + math.log(4) / math.log(64)))
    shapes = expected_shapes(config)
    assert shapes["model.layers.0.self_attn.qkv_proj.weight"] == (4 * 16 + 2 * 2 * 16, 64)
    assert shapes["model.layers.0.mlp.gate_up_proj.weight"] == (256, 64)
    assert not any(
        name.endswith(("self_attn.q_proj.weight", "mlp.up_proj.weight")) for name in shapes
    )


def test_a_narrow_sliding_window_is_refused(folder: Path) -> None:
    raw = json.loads((folder / "config.json").read_text())
    assert model_config_from_hf({**raw, "sliding_window": 4 * CONTEXT}, "p").family == "phi3"
    with pytest.raises(WeightsError, match="sliding_window=32 is not supported"):
        model_config_from_hf({**raw, "sliding_window": 32}, "p")


def test_positions_past_the_original_context_use_the_long_factors(folder: Path) -> None:
    from decodebench.modeling import rope_tables

    config = model_config_from_hf(json.loads((folder / "config.json").read_text()), "p")
    cos, _ = rope_tables(config, 2 * CONTEXT)
    scaling = config.rope_scaling
    assert isinstance(scaling, LongRopeScaling)
    base = 10_000.0 ** (-torch.arange(0, 12, 2, dtype=torch.float64) / 12)
    for position, factors in ((CONTEXT - 1, SHORT), (CONTEXT, LONG)):
        angles = position * base / torch.tensor(factors, dtype=torch.float64)
        expected = (angles.cos() * scaling.attention_factor).float()
        torch.testing.assert_close(cos[position, :6], expected)


def test_pytorch_decoder_matches_transformers(folder: Path) -> None:
    check_pytorch_decoder(folder, PROMPT, STEPS, CONTEXT)


@pytest.mark.slow
def test_fp16_packages_decode_the_fp32_tokens(folder: Path, tmp_path: Path) -> None:
    check_packages(folder, PROMPT, STEPS, CONTEXT, tmp_path)
