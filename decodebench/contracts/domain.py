"""Domain types shared by every role: what a user asks for and what a build is."""

from __future__ import annotations

import hashlib
import json
import re
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
from decodebench.contracts.recipes import parse_recipe
from decodebench.contracts.uploads import MODEL_NAME, UPLOAD_PREFIX

# The variant's names, which most of the project imports from here, live in contracts/variants.py.
from decodebench.contracts.variants import MAX_PREFILL_CHUNK as MAX_PREFILL_CHUNK
from decodebench.contracts.variants import Attention as Attention
from decodebench.contracts.variants import KVCache as KVCache
from decodebench.contracts.variants import VariantSpec as VariantSpec
from decodebench.contracts.verdicts import DEFAULT_MIN_EFFECT, MAX_MIN_EFFECT

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
