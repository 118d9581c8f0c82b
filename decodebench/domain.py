"""Domain types shared by every role: what a user asks for and what a build is."""

from __future__ import annotations

import hashlib
import json
import re
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from decodebench.presets import PRESETS
from decodebench.profiles import DEVICE_PROFILES

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


class Attention(StrEnum):
    repeat_kv = "repeat_kv"
    folded = "folded"


class Quant(StrEnum):
    fp16 = "fp16"


class VariantSpec(BaseModel):
    """One point of the variant space; everything that changes the built graph."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str | None = Field(
        default=None, description="Label shown in comparisons; derived from the axes when omitted"
    )
    attention: Attention = Attention.folded
    context: int = Field(default=512, ge=64, le=8192, description="KV-cache length in tokens")
    layers: int | None = Field(
        default=None, ge=1, le=128, description="Override the preset's decoder layer count"
    )
    quant: Quant = Quant.fp16

    @field_validator("name")
    @classmethod
    def _name_is_simple(cls, value: str | None) -> str | None:
        if value is not None and not NAME_PATTERN.match(value):
            raise ValueError("must be 1-64 characters of letters, digits, '.', '_' or '-'")
        return value

    @property
    def label(self) -> str:
        if self.name:
            return self.name
        parts = [self.attention.value, f"ctx{self.context}", self.quant.value]
        if self.layers is not None:
            parts.append(f"L{self.layers}")
        return "-".join(parts)

    def graph_identity(self) -> dict[str, object]:
        """The axes that change the artifact (the label does not)."""
        return self.model_dump(mode="json", exclude={"name"})


class SweepSpec(BaseModel):
    """A user's request: one model, several variants, several device classes."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(description="Model preset name, e.g. tiny-gqa or exaone-4.0-1.2b")
    variants: list[VariantSpec] = Field(min_length=1, max_length=16)
    devices: list[str] = Field(min_length=1, max_length=16, description="Device classes")
    prompts: int = Field(default=30, ge=1, le=30, description="Prompts of the built-in set")
    decode_tokens: int = Field(default=32, ge=1, le=1024, description="Tokens decoded per prompt")
    repetitions: int = Field(default=1, ge=1, le=10, description="Runs per variant and device")

    @field_validator("model")
    @classmethod
    def _known_model(cls, value: str) -> str:
        if value not in PRESETS:
            raise ValueError(f"unknown model preset {value!r}; known: {', '.join(sorted(PRESETS))}")
        return value

    @field_validator("devices")
    @classmethod
    def _known_devices(cls, value: list[str]) -> list[str]:
        for device_class in value:
            if device_class not in DEVICE_PROFILES:
                known = ", ".join(sorted(DEVICE_PROFILES))
                raise ValueError(f"unknown device class {device_class!r}; known: {known}")
        if len(set(value)) != len(value):
            raise ValueError("device classes must be distinct")
        return value

    @model_validator(mode="after")
    def _distinct_variant_labels(self) -> SweepSpec:
        labels = [variant.label for variant in self.variants]
        duplicates = sorted({label for label in labels if labels.count(label) > 1})
        if duplicates:
            raise ValueError(
                f"variants must have distinct labels; repeated: {', '.join(duplicates)}"
            )
        return self


def build_key(model: str, variant: VariantSpec, toolchain: dict[str, str]) -> str:
    """Content address of a build: same model, same graph axes, same toolchain → same artifact."""
    identity = {"model": model, "variant": variant.graph_identity(), "toolchain": toolchain}
    canonical = json.dumps(identity, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()
