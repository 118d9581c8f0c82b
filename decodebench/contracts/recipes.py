"""Quantization recipes: a small grammar, named presets, one canonical spelling.

Grammar (whitespace is ignored, rules are separated by commas)::

    recipe := preset | rule ("," rule)*
    preset := "fp16" | "w8" | "w4" | "base" | "top" K
    rule   := target "=" scheme | "top" K ["=" scheme]
    target := "embed" | "attn" | "ffn" | "lm_head"
    scheme := "fp16" | "int8" ["/" B] | "int4" ["/" B] | "lut" N

- ``int8`` is symmetric per output channel, ``int8/B`` and ``int4/B`` symmetric per block of B
  input channels (``int4`` alone means ``int4/32``): Core ML ``constexpr_blockwise_shift_scale``.
- ``lutN`` palettizes the whole tensor to 2**N values (N in 2, 4, 6, 8), k-means in 1-D:
  ``constexpr_lut_to_dense``.
- ``topK[=scheme]`` promotes the K decoder layers whose quantization hurts the output most
  (measured, see :mod:`decodebench.formats.coreml.quant.sensitivity`) to ``scheme`` (``int8`` by default), both
  their attention and FFN weights.
- Targets not named stay fp16. With tied embeddings the one shared matrix follows ``lm_head``.

Presets: ``fp16``; ``w8`` (every target int8 per channel); ``w4`` (every target int4/32);
``base`` (attn, ffn and embed int4/32, lm_head lut6); ``topK`` (``base`` plus ``topK=int8``).
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Target = Literal["embed", "attn", "ffn", "lm_head"]
TARGETS: tuple[Target, ...] = ("embed", "attn", "ffn", "lm_head")
DEFAULT_INT4_BLOCK = 32
LUT_BITS = (2, 4, 6, 8)
MAX_BLOCK = 4096


class RecipeError(ValueError):
    """The recipe text does not follow the grammar; the message says where."""


class Scheme(BaseModel):
    """How one weight tensor is stored."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["fp16", "int8", "int4", "lut"]
    bits: int = Field(ge=2, le=16)
    block: int = Field(default=0, ge=0, description="Input channels per scale; 0 = per channel")

    @property
    def text(self) -> str:
        if self.kind == "fp16":
            return "fp16"
        if self.kind == "lut":
            return f"lut{self.bits}"
        if self.kind == "int8" and self.block == 0:
            return "int8"
        return f"{self.kind}/{self.block}"

    @property
    def compressed(self) -> bool:
        return self.kind != "fp16"


FP16 = Scheme(kind="fp16", bits=16)
INT8 = Scheme(kind="int8", bits=8)
INT4 = Scheme(kind="int4", bits=4, block=DEFAULT_INT4_BLOCK)
LUT6 = Scheme(kind="lut", bits=6)


class QuantRecipe(BaseModel):
    """A parsed recipe: one scheme per target, plus the sensitivity promotion."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    embed: Scheme = FP16
    attn: Scheme = FP16
    ffn: Scheme = FP16
    lm_head: Scheme = FP16
    promote_top: int = Field(default=0, ge=0, le=128)
    promote_to: Scheme = INT8

    def scheme(self, target: Target) -> Scheme:
        return getattr(self, target)

    @property
    def is_fp16(self) -> bool:
        return all(not self.scheme(target).compressed for target in TARGETS)

    @property
    def needs_sensitivity(self) -> bool:
        return self.promote_top > 0

    def layer_scheme(self, target: Target, promoted: bool) -> Scheme:
        """The scheme of a decoder layer's ``attn`` or ``ffn`` weights."""
        return self.promote_to if promoted else self.scheme(target)

    @property
    def canonical(self) -> str:
        """One spelling per recipe: the preset name when it is one, else sorted rules."""
        for name, preset in PRESET_RECIPES.items():
            if preset == self:
                return name
        if (
            self.promote_top
            and self.model_copy(update={"promote_top": 0}) == PRESET_RECIPES["base"]
            and self.promote_to == INT8
        ):
            return f"top{self.promote_top}"
        rules = [
            f"{target}={self.scheme(target).text}"
            for target in TARGETS
            if self.scheme(target).compressed
        ]
        if self.promote_top:
            rules.append(f"top{self.promote_top}={self.promote_to.text}")
        return ",".join(rules) or "fp16"


def _uniform(scheme: Scheme) -> QuantRecipe:
    return QuantRecipe(embed=scheme, attn=scheme, ffn=scheme, lm_head=scheme)


PRESET_RECIPES: dict[str, QuantRecipe] = {
    "fp16": QuantRecipe(),
    "w8": _uniform(INT8),
    "w4": _uniform(INT4),
    "base": QuantRecipe(embed=INT4, attn=INT4, ffn=INT4, lm_head=LUT6),
}


_TOP = re.compile(r"^top(\d{1,3})$")
_SCHEME = re.compile(r"^(?:(fp16)|(int8|int4)(?:/(\d{1,4}))?|lut(\d))$")


def parse_scheme(text: str) -> Scheme:
    match = _SCHEME.match(text)
    if not match:
        raise RecipeError(
            f"unknown scheme {text!r}; use fp16, int8, int8/B, int4, int4/B or lutN (N in 2,4,6,8)"
        )
    fp16, integer, block, lut_bits = match.groups()
    if fp16:
        return FP16
    if integer:
        default_block = DEFAULT_INT4_BLOCK if integer == "int4" else 0
        size = default_block if block is None else int(block)
        if block is not None and not 1 <= size <= MAX_BLOCK:
            raise RecipeError(f"block size {size} in {text!r} must be 1..{MAX_BLOCK}")
        if integer == "int4" and size == 0:
            raise RecipeError("int4 needs a block size (int4/B); per-channel int4 loses too much")
        kind: Literal["int8", "int4"] = "int4" if integer == "int4" else "int8"
        return Scheme(kind=kind, bits=int(integer[3:]), block=size)
    bits = int(lut_bits)
    if bits not in LUT_BITS:
        raise RecipeError(f"lut{bits}: palettes of 2, 4, 6 or 8 bits only")
    return Scheme(kind="lut", bits=bits)


def parse_recipe(text: str) -> QuantRecipe:
    """Parse a recipe (see the module docstring); raises :class:`RecipeError`."""
    cleaned = re.sub(r"\s+", "", text).lower()
    if not cleaned:
        raise RecipeError("empty recipe; use fp16 for no quantization")
    if cleaned in PRESET_RECIPES:
        return PRESET_RECIPES[cleaned]
    top = _TOP.match(cleaned)
    if top:
        return PRESET_RECIPES["base"].model_copy(update={"promote_top": int(top.group(1))})
    fields: dict[str, object] = {}
    for rule in cleaned.split(","):
        name, equals, scheme_text = rule.partition("=")
        top = _TOP.match(name)
        if top:
            if "promote_top" in fields:
                raise RecipeError("topK given twice")
            fields["promote_top"] = int(top.group(1))
            if equals:
                fields["promote_to"] = parse_scheme(scheme_text)
            continue
        if name not in TARGETS:
            raise RecipeError(
                f"unknown target {name!r} in {rule!r}; targets: {', '.join(TARGETS)}, topK"
            )
        if not equals:
            raise RecipeError(f"rule {rule!r} needs a scheme: {name}=<scheme>")
        if name in fields:
            raise RecipeError(f"target {name!r} given twice")
        fields[name] = parse_scheme(scheme_text)
    return QuantRecipe.model_validate(fields)
