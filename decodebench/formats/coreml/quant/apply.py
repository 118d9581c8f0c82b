"""Apply a recipe: which scheme each weight gets, and the MIL rewrite to ``constexpr_*`` ops.

The rewrite replaces each weight ``const`` of a converted program (named after its torch
parameter by the frontend) with the compressed op coremltools' own ``ct.optimize.coreml`` would
emit, computed by :mod:`decodebench.formats.coreml.quant.numeric` (bit-identical data): int4/int8 as
``constexpr_blockwise_shift_scale``, palettes as ``constexpr_lut_to_dense``. It runs on the MIL
program *before* serialization, so the fp16 weights are never written, re-read and re-converted.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict

from decodebench.contracts.recipes import QuantRecipe, Scheme, Target
from decodebench.formats.coreml.quant.numeric import (
    LinearQuantized,
    Palettized,
    depalettize,
    dequantize,
    fake_quantize_linear,
    palettize,
    quantize_linear,
    to_dtype,
)

_LAYER_WEIGHT = re.compile(r"^model\.layers\.(\d+)\.(self_attn|mlp)\.(\w+)_proj\.weight")
EMBED = "model.embed_tokens.weight"
LM_HEAD = "lm_head.weight"

Compressed = LinearQuantized | Palettized
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WeightRole:
    target: Target
    layer: int | None = None


def weight_role(name: str, tied: bool) -> WeightRole | None:
    """What a parameter (or a const named after one) is in recipe terms."""
    if name.startswith(EMBED):
        # Tied: one matrix serves both ends and follows the lm_head rule (see the recipe doc).
        return WeightRole("lm_head" if tied else "embed")
    if name.startswith(LM_HEAD):
        return WeightRole("lm_head")
    match = _LAYER_WEIGHT.match(name)
    if match:
        return WeightRole("attn" if match.group(2) == "self_attn" else "ffn", int(match.group(1)))
    return None


def parameter_name(const_name: str) -> str:
    """The torch parameter a frontend const comes from (suffixes like ``_to_fp16`` dropped)."""
    for prefix in (EMBED, LM_HEAD):
        if const_name.startswith(prefix):
            return prefix
    match = _LAYER_WEIGHT.match(const_name)
    return match.group(0) if match else const_name


class WeightChoice(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    target: str
    layer: int | None
    scheme: str


@dataclass
class QuantPlan:
    """The recipe resolved for one model: the promoted layers and each weight's scheme."""

    recipe: QuantRecipe
    tied: bool
    promoted: frozenset[int] = frozenset()
    _cache: dict[str, Compressed] = field(default_factory=dict, repr=False)

    def scheme_for(self, name: str) -> Scheme | None:
        role = weight_role(name, self.tied)
        if role is None:
            return None
        if role.layer is not None:
            return self.recipe.layer_scheme(role.target, role.layer in self.promoted)
        return self.recipe.scheme(role.target)

    def promote(self, layers: frozenset[int]) -> None:
        """Fix the promoted layers, and forget cached compressions the artifact will not use
        (the promoted layers' base-scheme weights, measured during sensitivity)."""
        self.promoted = frozenset(layers)
        for key in list(self._cache):
            name, _, scheme = key.partition("|")
            chosen = self.scheme_for(name)
            if chosen is None or chosen.text != scheme:
                del self._cache[key]

    def choices(self, names: list[str]) -> list[WeightChoice]:
        result = []
        for name in names:
            role = weight_role(name, self.tied)
            scheme = self.scheme_for(name)
            if role is not None and scheme is not None:
                result.append(
                    WeightChoice(
                        name=name, target=role.target, layer=role.layer, scheme=scheme.text
                    )
                )
        return result

    def compress(self, name: str, weight: torch.Tensor) -> Compressed | None:
        """The compressed form of ``weight`` (computed once per parameter), or None for fp16."""
        scheme = self.scheme_for(name)
        if scheme is None or not scheme.compressed:
            return None
        key = f"{name}|{scheme.text}"
        if key not in self._cache:
            if not self.can_compress(name, weight, scheme):
                return None
            self._cache[key] = compress(weight, scheme)
        return self._cache[key]

    @staticmethod
    def can_compress(name: str, weight: torch.Tensor, scheme: Scheme) -> bool:
        if scheme.block and weight.shape[-1] % scheme.block:
            # What ct.optimize.coreml does too: such a weight stays fp16 (logged).
            log.warning(
                "%s: %d input channels not a multiple of block %d; kept fp16",
                name,
                weight.shape[-1],
                scheme.block,
            )
            return False
        return True


def compress(weight: torch.Tensor, scheme: Scheme) -> Compressed:
    weight = weight.to(torch.float16)
    if scheme.kind == "lut":
        return palettize(weight, scheme.bits)
    return quantize_linear(weight, scheme.bits, scheme.block)


def decompress(compressed: Compressed, dtype: torch.dtype = torch.float16) -> torch.Tensor:
    """The fp16 weight the device computes with, returned as ``dtype``."""
    if isinstance(compressed, Palettized):
        return to_dtype(depalettize(compressed), dtype)
    return dequantize(compressed, dtype)


def fake_quantize(
    weight: torch.Tensor, scheme: Scheme, dtype: torch.dtype = torch.float16
) -> torch.Tensor:
    """What the device computes with: ``weight`` quantized and back (fp16), as ``dtype``."""
    if not scheme.compressed:
        return to_dtype(weight.to(torch.float16), dtype)
    if scheme.kind == "lut":
        return decompress(compress(weight, scheme), dtype)
    return fake_quantize_linear(weight.to(torch.float16), scheme.bits, scheme.block, dtype)


def apply_plan(program: object, plan: QuantPlan) -> dict[str, str]:
    """Rewrite the weight consts of every function of ``program``; returns {const: op type}.

    Consts of one parameter in several functions get the very same compressed arrays.
    """
    from coremltools.converters.mil import Builder as mb
    from coremltools.converters.mil.mil import types
    from coremltools.converters.mil.mil.scope import ScopeInfo, ScopeSource

    rewritten: dict[str, str] = {}
    for function in program.functions.values():  # type: ignore[attr-defined]
        # One `with function` for all the rewrites: leaving it walks the whole function (to
        # propagate non-replaceable vars), ~5 s if done per weight on EXAONE's 211 weights.
        with function:
            for op in list(function.operations):
                if op.op_type != "const" or op.outputs[0].val is None:
                    continue
                name = parameter_name(op.name)
                value = op.outputs[0].val
                if not isinstance(value, np.ndarray) or value.ndim != 2:
                    continue
                compressed = plan.compress(name, torch.from_numpy(np.ascontiguousarray(value)))
                if compressed is None:
                    continue
                # The new ops carry the const's scopes (torch module names), which validation
                # needs.
                scopes = [
                    ScopeInfo(source=source, data=list(data))
                    for source, data in op.scopes.items()
                    if source != ScopeSource.COREMLTOOLS_GRAPH_PASS
                ]
                with mb.scope(*scopes):
                    new_var = _constexpr(mb, types, op, compressed)
                function.replace_uses_of_var_after_op(
                    anchor_op=op, old_var=op.outputs[0], new_var=new_var, no_check_var_types=True
                )
                function.remove_ops([op])
                _release_value(op)
                rewritten[op.name] = new_var.op.op_type  # type: ignore[attr-defined]
    return rewritten


def _release_value(removed: object) -> None:
    """A removed const op, its ``val`` input and its output var still reference each other, so
    the weight array would live until the next full garbage collection, typically after every
    weight has been rewritten (the whole fp16 model, 2.4 GB at EXAONE size, on top of its
    compressed form). Dropping their value frees each fp16 weight once its replacement exists."""
    held = [*removed.outputs, getattr(removed, "val", None)]  # type: ignore[attr-defined]
    for var in held:
        if hasattr(var, "_sym_val"):
            var._sym_val = None


def _constexpr(mb: object, types: object, op: object, compressed: Compressed) -> object:
    # coremltools marks sub-byte types by a dtype carrying metadata; a view applies it without
    # copying the data (astype would copy every weight once more).
    if isinstance(compressed, Palettized):
        indices_dtype = types.nptype_from_builtin(  # type: ignore[attr-defined]
            types.string_to_builtin(f"uint{compressed.bits}")  # type: ignore[attr-defined]
        )
        lut = compressed.lut.reshape(1, 1, -1, 1)
        return mb.constexpr_lut_to_dense(  # type: ignore[attr-defined]
            indices=compressed.indices.view(indices_dtype),
            lut=lut,
            vector_axis=None,
            before_op=op,
            name=op.name + "_palettized",  # type: ignore[attr-defined]
        )
    data_dtype = types.nptype_from_builtin(  # type: ignore[attr-defined]
        types.string_to_builtin(f"int{compressed.bits}")  # type: ignore[attr-defined]
    )
    return mb.constexpr_blockwise_shift_scale(  # type: ignore[attr-defined]
        data=compressed.data.view(data_dtype),
        scale=compressed.scale,
        offset=None,
        before_op=op,
        name=op.name + "_quantized",  # type: ignore[attr-defined]
    )
