"""Tiny checkpoints of each model family, made by transformers' own classes, and the proofs each
family's test runs on them.

A checkpoint has random (seeded) weights plus two "massive activation" channels: residual
channels whose embedding columns hold values of 300-500, as real LLMs' residual streams do, with
the norms' weights small there (as real checkpoints learn). Their mean of squares is far past
fp16's range, so the fp16 package only decodes the fp32 tokens if every norm stays fp16-safe.

Each family's test checks (1) our PyTorch decoder in fp32 against transformers' logits, quickly,
and (2) ``build_variant(weights=folder)`` fp16 packages, repeat_kv and folded, decoded by the MIL
interpreter: exactly transformers fp32's greedy tokens, with every top-1/top-2 margin of the
reference wide enough that fp16 rounding alone could not flip one.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from decodebench.building.weights import load_checkpoint
from tests.support.families import MASSIVE_CHANNELS, tiny_checkpoint


def test_massive_channels_overflow_fp16_squares(tmp_path: Path) -> None:
    """The checkpoints' residual stream really is beyond fp16 in a naive RMSNorm."""
    folder = tiny_checkpoint(
        tmp_path / "llama",
        "LlamaConfig",
        "LlamaForCausalLM",
        {
            "vocab_size": 64,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
        },
        seed=0,
    )
    _, tensors = load_checkpoint(folder, dtype=torch.float32)
    embed = tensors["model.embed_tokens.weight"]
    squares = embed.pow(2).sum(-1)
    assert float(squares.min()) > torch.finfo(torch.float16).max
    assert float(embed[:, list(MASSIVE_CHANNELS)].abs().min()) >= 300
    assert float(embed[:, list(MASSIVE_CHANNELS)].abs().max()) <= 500


def test_config_properties_agree_with_the_family_strategies() -> None:
    """The quantization sensitivity reads ModelConfig's flags; the decoder reads the family."""
    from decodebench.contracts.presets import TINY_LLAMA
    from decodebench.modeling.families import FAMILIES

    for name, family in FAMILIES.items():
        config = TINY_LLAMA.model_copy(update={"family": name})
        assert config.qkv_bias == family.attention_bias, name
        assert config.qk_norm == family.qk_norm, name
        assert config.post_norm == ("input_layernorm" not in family.norms), name


@pytest.mark.parametrize(
    ("name", "total", "non_embedding"),
    [
        # The model cards' figures: Qwen3-0.6B "0.6B, 0.44B non-embedding", Qwen3-1.7B "1.7B,
        # 1.4B non-embedding", SmolLM3 "3B".
        ("qwen3-0.6b", 0.6, 0.44),
        ("qwen3-1.7b", 1.7, 1.4),
        ("smollm3-3b", 3.1, 2.8),
        ("phi-4-mini", 3.8, 3.2),  # "3.8B parameters"
        ("gemma-3-270m", 0.3, 0.10),  # "170M embedding, 100M transformer parameters"
        ("gemma-3-1b", 1.0, 0.7),
    ],
)
def test_presets_have_the_published_sizes(name: str, total: float, non_embedding: float) -> None:
    import math

    from decodebench.building.weights import expected_shapes
    from decodebench.contracts.presets import get_preset

    shapes = expected_shapes(get_preset(name))
    count = sum(math.prod(shape) for shape in shapes.values())
    embedding = math.prod(shapes["model.embed_tokens.weight"])
    assert round(count / 1e9, 1) == total
    assert round((count - embedding) / 1e9, 2 if non_embedding < 1 else 1) == non_embedding
