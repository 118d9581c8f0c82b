"""A variant: one point of the variant space, everything that changes the built graph, and the
build key that content-addresses what it builds."""

from __future__ import annotations

import hashlib
import json
import re
from enum import StrEnum
from typing import Any

from pydantic import ConfigDict, Field, StrictBool, StrictInt, field_validator, model_validator

from decodebench.contracts.base import Incoming
from decodebench.contracts.names import DEFAULT_FORMAT, FormatName
from decodebench.contracts.recipes import RecipeError, parse_recipe
from decodebench.contracts.uploads import MODEL_NAME

NAME_PATTERN = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")


class Attention(StrEnum):
    repeat_kv = "repeat_kv"
    folded = "folded"


class KVCache(StrEnum):
    state = "state"  # Core ML state, written in the graph (slice_update + state write)
    input = "input"  # a model input; the host writes the new token's K/V (outputs) itself


MAX_PREFILL_CHUNK = 512
# Each format's own K/V layout, left out of a derived label (Core AI passes the cache in).
_FORMAT_KV = {FormatName.coreml: KVCache.state, FormatName.coreai: KVCache.input}

# Axes added after builds were first keyed: left out of the identity while at their default, so
# every build keyed before they existed keeps its key (and its artifact).
_LATER_AXES_DEFAULTS: dict[str, object] = {
    "format": DEFAULT_FORMAT.value,
    "kv": "state",
    "prefill_chunk": None,
    "package": None,
    "fold": False,
    "kv_window": False,
    "allow_non_finite": False,
}
# What a package built elsewhere already decides: a variant naming one leaves these out.
_PACKAGE_DECIDES = ("attention", "kv", "kv_window", "quant", "layers", "prefill_chunk")


class VariantSpec(Incoming):
    """One point of the variant space; everything that changes the built graph."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str | None = Field(
        default=None, description="Label shown in comparisons; derived from the axes when omitted"
    )
    format: FormatName = Field(
        default=DEFAULT_FORMAT,
        description="The model format the variant is built in (coreml: a Core ML .mlpackage)",
    )
    attention: Attention = Attention.folded
    kv: KVCache = Field(
        default=KVCache.state,
        description="state: KV cache is Core ML state; input: host-owned cache passed in",
    )
    kv_window: StrictBool = Field(
        default=False,
        description="Sliding-window layers keep only their last window of K/V (a ring buffer) "
        "instead of the whole context; kv=state, decode only, a model with sliding layers",
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
        description="Quantization recipe: fp16, w8, w4, base, topK or rules (see decodebench.formats.coreml.quant)",
    )
    package: str | None = Field(
        default=None,
        description="An uploaded .mlpackage (its model name) to run instead of building one; "
        "context must be the package's KV length",
    )
    fold: StrictBool = Field(
        default=False,
        description="With package: fold its GQA KV replication (decodebench fold) and verify",
    )
    allow_non_finite: StrictBool = Field(
        default=False,
        description="With package: publish it even when its decode makes a non-finite value "
        "(an fp16 overflow), to measure its speed: its tokens are not to be trusted",
    )

    @field_validator("package")
    @classmethod
    def _package_name(cls, value: str | None) -> str | None:
        if value is not None and not MODEL_NAME.match(value):
            raise ValueError("must be 1-48 characters of letters, digits, '.', '_' or '-'")
        return value

    @model_validator(mode="before")
    @classmethod
    def _core_ai_keeps_kv_as_inputs(cls, data: Any) -> Any:
        # A Core AI build passes its KV cache in and out (K/V as Core AI states: not yet).
        if isinstance(data, dict) and data.get("format") == "coreai" and data.get("kv") is None:
            return {**data, "kv": "input"}
        return data

    @model_validator(mode="after")
    def _package_decides_the_graph(self) -> VariantSpec:
        if self.package is None:
            if self.fold:
                raise ValueError("fold applies to a package; for a build use attention=folded")
            if self.allow_non_finite:
                raise ValueError("allow_non_finite applies to a package; a build is checked")
            return self
        # Left at their defaults (so a stored spec validates again): the package decides.
        fields = type(self).model_fields
        given = [axis for axis in _PACKAGE_DECIDES if getattr(self, axis) != fields[axis].default]
        if given:
            raise ValueError(f"a package variant is built already; leave out {', '.join(given)}")
        return self

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
    def _window_is_a_decode_state(self) -> VariantSpec:
        if not self.kv_window:
            return self
        if self.kv != KVCache.state:
            raise ValueError("kv_window needs kv=state (the ring is written in the graph)")
        if self.prefill_chunk is not None:
            raise ValueError(
                "kv_window has no prefill function (a chunk would overwrite keys its own "
                "earlier rows still see); leave out prefill_chunk"
            )
        return self

    @model_validator(mode="after")
    def _chunk_fits_context(self) -> VariantSpec:
        if self.prefill_chunk is not None and self.prefill_chunk > self.context:
            raise ValueError(
                f"prefill_chunk ({self.prefill_chunk}) must not exceed context ({self.context})"
            )
        return self

    @property
    def label(self) -> str:
        """Derived from the axes; a format other than Core ML leads it (``coreai-folded-…``),
        so rows of both formats of one model tell apart wherever a label is shown."""
        if self.name:
            return self.name
        if self.package is not None:
            return f"{self.package}{'-fold' if self.fold else ''}-ctx{self.context}"
        parts = [self.attention.value, f"ctx{self.context}", self.quant]
        if self.format != DEFAULT_FORMAT:
            parts.insert(0, self.format.value)
        if self.kv != _FORMAT_KV[self.format]:
            parts.append(f"kv{self.kv.value}")
        if self.kv_window:
            parts.append("kvwin")
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


def build_key(
    model: str,
    variant: VariantSpec,
    toolchain: dict[str, str],
    references: dict[str, object] | None = None,
) -> str:
    """Content address of a build: same model, same graph axes, same toolchain → same artifact.
    A model with a tokenizer also keys the prompts its build carries reference outputs for."""
    identity: dict[str, object] = {
        "model": model,
        "variant": variant.graph_identity(),
        "toolchain": toolchain,
    }
    if references is not None:
        identity["references"] = references
    canonical = json.dumps(identity, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()
