"""Domain types shared by every role: what a user asks for and what a build is."""

from __future__ import annotations

import hashlib
import json
import re
from enum import StrEnum
from typing import Annotated

from pydantic import (
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    field_validator,
    model_validator,
)

from decodebench.contracts.base import Incoming
from decodebench.contracts.names import SweepPriority
from decodebench.contracts.presets import MODELS, has_tokenizer
from decodebench.contracts.profiles import known_device_classes
from decodebench.contracts.recipes import RecipeError, parse_recipe
from decodebench.contracts.uploads import MODEL_NAME, UPLOAD_PREFIX
from decodebench.contracts.verdicts import DEFAULT_MIN_EFFECT, MAX_MIN_EFFECT

NAME_PATTERN = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")

# A sweep's own prompt set: at most as many prompts as the built-in set, each a plain text.
MAX_PROMPTS = 30
MAX_PROMPT_CHARS = 4000
# Control characters (C0, DEL, C1) other than newline and tab: invisible, and some end a
# terminal line or a C string early on a device.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
# The built-in sets, by version (decodebench.prompts keeps their texts).
BUILTIN_PROMPT_SET = "builtin-v1"
CHAT_PROMPT_SET = "chat-v1"
CUSTOM_PROMPT_SET = "custom"


class Attention(StrEnum):
    repeat_kv = "repeat_kv"
    folded = "folded"


class KVCache(StrEnum):
    state = "state"  # Core ML state, written in the graph (slice_update + state write)
    input = "input"  # a model input; the host writes the new token's K/V (outputs) itself


MAX_PREFILL_CHUNK = 512

# Axes added after builds were first keyed: left out of the identity while at their default, so
# every build keyed before they existed keeps its key (and its artifact).
_LATER_AXES_DEFAULTS: dict[str, object] = {
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
        if self.name:
            return self.name
        if self.package is not None:
            return f"{self.package}{'-fold' if self.fold else ''}-ctx{self.context}"
        parts = [self.attention.value, f"ctx{self.context}", self.quant]
        if self.kv != KVCache.state:
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


class SweepSpec(Incoming):
    """A user's request: one model, several variants, several device classes."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(
        max_length=64,
        description="Model preset name, e.g. tiny-gqa or exaone-4.0-1.2b, or upload:<name> for "
        "an uploaded checkpoint (POST /api/v1/models)",
    )
    variants: list[VariantSpec] = Field(min_length=1, max_length=16)
    devices: list[str] = Field(min_length=1, max_length=16, description="Device classes")
    prompts: StrictInt = Field(
        default=30,
        ge=1,
        le=MAX_PROMPTS,
        description="Prompts of the built-in set (the count of prompt_texts when those are given)",
    )
    prompt_texts: list[Annotated[str, Field(min_length=1, max_length=MAX_PROMPT_CHARS)]] | None = (
        Field(
            default=None,
            min_length=1,
            max_length=MAX_PROMPTS,
            description="The sweep's own prompts instead of the built-in set: plain text (newline "
            "and tab allowed, no other control character), tokenized with the model's tokenizer and "
            "chat template when it has one, with the pseudo-tokenizer otherwise",
        )
    )
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
    learned_noise: StrictBool = Field(
        default=False,
        description="Simulated/emulated devices draw their run-to-run offset with the spread "
        "learned for the device class from the project's stored runs (when one is learned) "
        "instead of the profile's assumed one. Real devices ignore it",
    )
    priority: SweepPriority | None = Field(
        default=None,
        description="ci, nightly or adhoc: the sweep's weight when several share devices "
        "(None: from how it was submitted: a schedule's sweeps are nightly, others adhoc)",
    )

    @field_validator("model")
    @classmethod
    def _known_model(cls, value: str) -> str:
        if value.startswith(UPLOAD_PREFIX):  # the server checks that it exists
            if not MODEL_NAME.match(value.removeprefix(UPLOAD_PREFIX)):
                raise ValueError(
                    "upload:<name>: the name must be 1-48 letters, digits, '.', '_' or '-'"
                )
            return value
        if value not in MODELS:
            raise ValueError(f"unknown model preset {value!r}; known: {', '.join(sorted(MODELS))}")
        return value

    @field_validator("prompt_texts")
    @classmethod
    def _plain_prompts(cls, value: list[str] | None) -> list[str] | None:
        for index, text in enumerate(value or ()):
            control = _CONTROL.search(text)
            if control is not None:
                raise ValueError(
                    f"prompt_texts.{index} holds the control character "
                    f"U+{ord(control.group()):04X} at position {control.start()}; only newline "
                    "and tab are allowed"
                )
            if not text.strip():
                raise ValueError(f"prompt_texts.{index} is only white space")
        return value

    @model_validator(mode="after")
    def _prompt_count_matches_texts(self) -> SweepSpec:
        if self.prompt_texts is None:
            return self
        if "prompts" in self.model_fields_set and self.prompts != len(self.prompt_texts):
            raise ValueError(
                f"prompts ({self.prompts}) differs from the {len(self.prompt_texts)} "
                "prompt_texts given; leave prompts out"
            )
        self.__dict__["prompts"] = len(self.prompt_texts)
        return self

    @property
    def prompt_set_version(self) -> str:
        """Which prompts the devices decode: a built-in set or the sweep's own."""
        if self.prompt_texts is not None:
            return CUSTOM_PROMPT_SET
        return CHAT_PROMPT_SET if has_tokenizer(self.model) else BUILTIN_PROMPT_SET

    def reference_identity(self) -> dict[str, object] | None:
        """What the fp32 reference outputs of this sweep depend on besides the model (None for
        models without a tokenizer, which have no reference): part of their builds' keys."""
        if not has_tokenizer(self.model):
            return None
        return prompt_set_identity(self.prompt_texts, self.prompts, self.decode_tokens)

    @field_validator("devices")
    @classmethod
    def _known_devices(cls, value: list[str]) -> list[str]:
        return known_device_classes(value)

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
        the model has, or more layers promoted by ``topK`` than it will have. An uploaded model's
        layers are checked by the server, which knows its config."""
        if self.model not in MODELS:
            return self
        preset = MODELS[self.model]
        for index, variant in enumerate(self.variants):
            if variant.layers is not None and variant.layers > preset.num_layers:
                raise ValueError(
                    f"variants.{index}.layers ({variant.layers}) is more than the "
                    f"{preset.num_layers} decoder layers {self.model} has"
                )
            if variant.kv_window and not any(preset.sliding_layers or ()):
                raise ValueError(
                    f"variants.{index}.kv_window: {self.model} has no sliding-window layers"
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


def prompt_set_identity(
    texts: list[str] | None, count: int, decode_tokens: int
) -> dict[str, object]:
    """The prompts (a built-in chat set prefix, or the sha256 of the sweep's own texts) and the
    decode length that reference outputs are computed for."""
    if texts is None:
        prompts: dict[str, object] = {"set": CHAT_PROMPT_SET, "count": count}
    else:
        canonical = json.dumps(texts, ensure_ascii=False, separators=(",", ":"))
        prompts = {
            "set": CUSTOM_PROMPT_SET,
            "sha256": hashlib.sha256(canonical.encode()).hexdigest(),
        }
    return {"prompts": prompts, "decode_tokens": decode_tokens}


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
