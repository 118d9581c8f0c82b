"""Gemma 3 text: sliding and global layers with their own RoPE bases, query_pre_attn_scalar,
q/k norms, four norms per layer stored as ``1 + w``, embeddings times sqrt(hidden), GELU-tanh and
the logits' soft-capping; a transformers checkpoint builds in fp16 and decodes its tokens over a prompt
longer than the sliding window."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from decodebench.building.weights import WeightsError, expected_shapes, model_config_from_hf
from decodebench.contracts.domain import Attention
from tests.support.families import (
    check_packages,
    check_pytorch_decoder,
    check_windowed_decoder,
    tiny_checkpoint,
)

CONTEXT = 64
WINDOW = 8
PROMPT = [5, 9, 200, 31, 77, 4, 180, 23, 64, 130, 2, 99, 41, 250, 8, 17]  # twice the window
STEPS = 12
SEED = 3
FIELDS = {
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "query_pre_attn_scalar": 24,
    "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
    "sliding_window": WINDOW,
    "rope_parameters": {
        "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
    },
    # Wide enough that the path keeps its margins, narrow enough that tanh bends the logits.
    "final_logit_softcapping": 1000.0,
    "tie_word_embeddings": True,
    "max_position_embeddings": CONTEXT,
    "initializer_range": 0.2,
}
EMBED_SCALE = 8.0  # sqrt(hidden_size)
# Gemma normalises each sub-block's output; a large gain there lets the layers, not the echo of
# the token's own (tied) embedding, pick the next token.
OUTPUT_GAIN = 40.0


def gain_to_weight(gain: float) -> float:
    return gain - 1.0  # Gemma's RMSNorm multiplies by 1 + w


def make(folder: Path, fields: dict) -> Path:
    return tiny_checkpoint(
        folder,
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        fields,
        SEED,
        gain_to_weight,
        EMBED_SCALE,
        OUTPUT_GAIN,
    )


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make(tmp_path_factory.mktemp("gemma3") / "tiny-gemma3", FIELDS)


def test_config_and_tensors(folder: Path) -> None:
    config = model_config_from_hf(json.loads((folder / "config.json").read_text()), "g")
    assert config.family == "gemma3"
    assert config.sliding_layers == (1, 1, 0) and config.sliding_window == WINDOW
    assert (config.rope_theta, config.rope_local_theta) == (1_000_000.0, 10_000.0)
    assert config.query_pre_attn_scalar == 24 and config.final_logit_softcapping == 1000.0
    shapes = expected_shapes(config)
    for norm in ("input", "post_attention", "pre_feedforward", "post_feedforward"):
        assert shapes[f"model.layers.0.{norm}_layernorm.weight"] == (64,)
    assert shapes["model.layers.0.self_attn.k_norm.weight"] == (16,)


def test_unsupported_gemma_keys_are_named(folder: Path) -> None:
    raw = json.loads((folder / "config.json").read_text())
    with pytest.raises(WeightsError, match="hidden_activation='silu'"):
        model_config_from_hf({**raw, "hidden_activation": "silu"}, "g")
    with pytest.raises(WeightsError, match="sliding_window is missing"):
        model_config_from_hf({**raw, "sliding_window": None}, "g")


def test_pytorch_decoder_matches_transformers(folder: Path) -> None:
    check_pytorch_decoder(folder, PROMPT, STEPS, CONTEXT)


def test_windowed_cache_decoder_matches_transformers(folder: Path) -> None:
    """kv_window: the sliding layers' ring of WINDOW slots, over a prompt twice the window."""
    check_windowed_decoder(folder, PROMPT, STEPS, CONTEXT)


def test_attention_softcapping_set_matches_transformers(tmp_path: Path) -> None:
    """transformers' Gemma 3 carries attn_logit_softcapping without applying it: so do we."""
    folder = make(tmp_path / "capped", {**FIELDS, "attn_logit_softcapping": 5.0})
    check_pytorch_decoder(folder, PROMPT, STEPS, CONTEXT)


@pytest.mark.slow
def test_fp16_packages_decode_the_fp32_tokens(folder: Path, tmp_path: Path) -> None:
    windowed = {"attention": Attention.folded, "kv_window": True}
    check_packages(folder, PROMPT, STEPS, CONTEXT, tmp_path, variants=(windowed,))
