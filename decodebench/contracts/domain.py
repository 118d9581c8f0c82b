"""Domain types shared by every role: what a user asks for and what a build is."""

from __future__ import annotations

import hashlib
import json
import re
from enum import StrEnum

from pydantic import ConfigDict, Field, StrictFloat, StrictInt, field_validator, model_validator

from decodebench.contracts.base import Incoming
from decodebench.contracts.names import SweepPriority
from decodebench.contracts.verdicts import DEFAULT_MIN_EFFECT, MAX_MIN_EFFECT
from decodebench.presets import PRESETS
from decodebench.profiles import get_profile
from decodebench.quant.recipe import RecipeError, parse_recipe

NAME_PATTERN = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")


class Attention(StrEnum):
    repeat_kv = "repeat_kv"
    folded = "folded"


class KVCache(StrEnum):
    state = "state"  # Core ML state, written in the graph (slice_update + state write)
    input = "input"  # a model input; the host writes the new token's K/V (outputs) itself


class Quant(StrEnum):
    """The named recipe presets (``topK`` for any K is one too; see decodebench.quant.recipe)."""

    fp16 = "fp16"
    w8 = "w8"
    w4 = "w4"
    base = "base"


MAX_PREFILL_CHUNK = 512

# Axes added after builds were first keyed: left out of the identity while at their default, so
# every build keyed before they existed keeps its key (and its artifact).
_LATER_AXES_DEFAULTS: dict[str, object] = {"kv": "state", "prefill_chunk": None}


class VariantSpec(Incoming):
    """One point of the variant space; everything that changes the built graph."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str | None = Field(
        default=None, description="Label shown in comparisons; derived from the axes when omitted"
    )
    attention: Attention = Attention.folded
    kv: KVCache = Field(
        default=KVCache.state,
        description="state: KV cache is Core ML state; input: host-owned cache passed in",
    )
    context: StrictInt = Field(default=512, ge=64, le=8192, description="KV-cache length in tokens")
    prefill_chunk: StrictInt | None = Field(
        default=None,
        ge=2,
        le=MAX_PREFILL_CHUNK,
        description="Query length of a prefill function next to decode; none when omitted",
    )
    layers: StrictInt | None = Field(
        default=None, ge=1, le=128, description="Override the preset's decoder layer count"
    )
    quant: str = Field(
        default="fp16",
        max_length=200,
        description="Quantization recipe: fp16, w8, w4, base, topK or rules (see decodebench.quant)",
    )

    @field_validator("name")
    @classmethod
    def _name_is_simple(cls, value: str | None) -> str | None:
        if value is not None and not NAME_PATTERN.match(value):
            raise ValueError("must be 1-64 characters of letters, digits, '.', '_' or '-'")
        return value

    @field_validator("quant", mode="before")
    @classmethod
    def _quant_is_a_recipe(cls, value: object) -> object:
        # One spelling per recipe, so "top08" and "base,top8"-style variants share a build key.
        if isinstance(value, StrEnum):
            value = value.value
        if not isinstance(value, str):
            return value
        try:
            return parse_recipe(value).canonical
        except RecipeError as error:
            raise ValueError(str(error)) from None

    @model_validator(mode="after")
    def _chunk_fits_context(self) -> VariantSpec:
        if self.prefill_chunk is not None and self.prefill_chunk > self.context:
            raise ValueError(
                f"prefill_chunk ({self.prefill_chunk}) must not exceed context ({self.context})"
            )
        return self

    @property
    def label(self) -> str:
        if self.name:
            return self.name
        parts = [self.attention.value, f"ctx{self.context}", self.quant]
        if self.kv != KVCache.state:
            parts.append(f"kv{self.kv.value}")
        if self.prefill_chunk is not None:
            parts.append(f"pf{self.prefill_chunk}")
        if self.layers is not None:
            parts.append(f"L{self.layers}")
        return "-".join(parts)

    def graph_identity(self) -> dict[str, object]:
        """The axes that change the artifact (the label does not)."""
        identity = self.model_dump(mode="json", exclude={"name"})
        for axis, default in _LATER_AXES_DEFAULTS.items():
            if identity.get(axis) == default:
                del identity[axis]
        return identity


class SweepSpec(Incoming):
    """A user's request: one model, several variants, several device classes."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(description="Model preset name, e.g. tiny-gqa or exaone-4.0-1.2b")
    variants: list[VariantSpec] = Field(min_length=1, max_length=16)
    devices: list[str] = Field(min_length=1, max_length=16, description="Device classes")
    prompts: StrictInt = Field(default=30, ge=1, le=30, description="Prompts of the built-in set")
    decode_tokens: StrictInt = Field(
        default=32, ge=1, le=1024, description="Tokens decoded per prompt"
    )
    repetitions: StrictInt = Field(
        default=1, ge=1, le=10, description="Runs per variant and device"
    )
    baseline: str | None = Field(
        default=None,
        max_length=64,
        description="Label of the variant every other one is judged against (default: the first)",
    )
    min_effect: StrictFloat = Field(
        default=DEFAULT_MIN_EFFECT,
        gt=0,
        le=MAX_MIN_EFFECT,
        description="Smallest relative change a verdict calls faster or slower (0.02 = 2%)",
    )
    noise_scale: StrictFloat | None = Field(
        default=None,
        ge=0,
        le=10,
        description="Scale of the simulated/emulated devices' timing noise (0: none); "
        "None: the agent's setting. Real devices ignore it",
    )
    priority: SweepPriority | None = Field(
        default=None,
        description="ci, nightly or adhoc: the sweep's weight when several share devices "
        "(None: from how it was submitted: a schedule's sweeps are nightly, others adhoc)",
    )

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
            get_profile(device_class)
        if len(set(value)) != len(value):
            raise ValueError("device classes must be distinct")
        return value

    @model_validator(mode="after")
    def _decode_fits_every_context(self) -> SweepSpec:
        for index, variant in enumerate(self.variants):
            if self.decode_tokens >= variant.context:
                raise ValueError(
                    f"decode_tokens ({self.decode_tokens}) leaves no room for a prompt in "
                    f"variants.{index}.context ({variant.context}); decode fewer tokens or "
                    "raise the context"
                )
        return self

    @model_validator(mode="after")
    def _baseline_is_a_variant(self) -> SweepSpec:
        labels = [variant.label for variant in self.variants]
        if self.baseline is not None and self.baseline not in labels:
            raise ValueError(
                f"baseline {self.baseline!r} is not a variant of this sweep; "
                f"variants: {', '.join(labels)}"
            )
        return self

    @model_validator(mode="after")
    def _variants_fit_the_preset(self) -> SweepSpec:
        """What the preset already decides, refused before anything is built: more layers than
        the model has, or more layers promoted by ``topK`` than it will have."""
        preset = PRESETS[self.model]
        for index, variant in enumerate(self.variants):
            if variant.layers is not None and variant.layers > preset.num_layers:
                raise ValueError(
                    f"variants.{index}.layers ({variant.layers}) is more than the "
                    f"{preset.num_layers} decoder layers {self.model} has"
                )
            layers = variant.layers or preset.num_layers
            promoted = parse_recipe(variant.quant).promote_top
            if promoted > layers:
                raise ValueError(
                    f"variants.{index}.quant promotes the top {promoted} layers but the model "
                    f"has {layers}; use top{layers} or fewer"
                )
        return self

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
