"""Model presets: real decoder shapes, built from a config with seeded random weights."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class ModelConfig(BaseModel):
    """The shape of a Llama-family decoder with grouped-query attention."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    family: str = Field(description="Architecture family: llama, qwen2 or exaone4")
    num_layers: int = Field(ge=1)
    hidden_size: int = Field(ge=8)
    intermediate_size: int = Field(ge=8)
    vocab_size: int = Field(ge=2)
    num_attention_heads: int = Field(ge=1)
    num_key_value_heads: int = Field(ge=1)
    head_dim: int = Field(ge=2)
    tie_word_embeddings: bool = True
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-5
    seed: int = 0

    @property
    def group_size(self) -> int:
        return self.num_attention_heads // self.num_key_value_heads


EXAONE_4_0_1_2B = ModelConfig(
    name="exaone-4.0-1.2b",
    family="exaone4",
    num_layers=30,
    hidden_size=2048,
    intermediate_size=4096,
    vocab_size=102400,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=64,
    tie_word_embeddings=True,
)

# Same head layout as EXAONE 4.0 (32 q heads over 8 KV heads, head_dim 64, G = 4), but only a
# few narrow layers so it converts in seconds: what tests and the demo build.
TINY_GQA = ModelConfig(
    name="tiny-gqa",
    family="exaone4",
    num_layers=2,
    hidden_size=256,
    intermediate_size=512,
    vocab_size=512,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=64,
    tie_word_embeddings=True,
)

PRESETS: dict[str, ModelConfig] = {preset.name: preset for preset in (EXAONE_4_0_1_2B, TINY_GQA)}


def get_preset(name: str) -> ModelConfig:
    try:
        return PRESETS[name]
    except KeyError:
        known = ", ".join(sorted(PRESETS))
        raise KeyError(f"unknown model preset {name!r}; known: {known}") from None
