"""A quantization recipe (:mod:`decodebench.contracts.recipes`) applied to a converted Core AI
program with Apple's coreai-opt: its data-free passes replace each weight constant by its
compressed form and the op that expands it at load, as Core ML's constexpr ops do.

- ``int8`` (per output channel) and ``int8/B`` / ``int4/B`` (per block of B input channels),
  symmetric: ``quantize_weights`` -> ``coreai.blockwise_shift_scale`` of int8 / int4 data, one
  fp16 scale per channel or block.
- ``lutN``: ``palettize_weights``, k-means per tensor -> ``coreai.lut_to_dense`` of N-bit
  indices into a 2**N-entry fp16 palette.

coreai-opt's passes apply one scheme to every weight of the program (each constant of over
1024 elements read by a matrix product, a gather or a transpose: the embedding, the
projections, the head; not the norms). A recipe whose targets differ (``base``, ``topK``,
``ffn=int4/32`` alone) has no such mapping and is refused by name, as is a weight the pass
skips (a block size that does not divide its input channels): a build is what its recipe says
or is not made.
"""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from decodebench.contracts.recipes import TARGETS, QuantRecipe, Scheme, parse_recipe

PASS_LOGGERS = (
    "coreai_opt.coreai_utils.passes.weight_quantization",
    "coreai_opt.coreai_utils.passes.weight_palettization",
)


class UnsupportedRecipe(ValueError):
    """The recipe has no coreai-opt mapping; the message names the recipe and why."""


@dataclass(frozen=True)
class CoreAIQuant:
    """One coreai-opt pass over the whole program: ``scheme`` is the recipe's one scheme."""

    recipe: str
    scheme: Scheme

    @property
    def compression_op(self) -> str:
        return "lut_to_dense" if self.scheme.kind == "lut" else "blockwise_shift_scale"


def plan_quantization(quant: str | QuantRecipe) -> CoreAIQuant | None:
    """The coreai-opt pass of a recipe (None for fp16); UnsupportedRecipe naming why not."""
    recipe = parse_recipe(quant) if isinstance(quant, str) else quant
    if recipe.is_fp16:
        return None
    name = recipe.canonical
    if recipe.promote_top:
        raise UnsupportedRecipe(
            f"quant: {name!r} promotes the {recipe.promote_top} most sensitive layers; "
            "coreai-opt's passes apply one scheme to every weight of a Core AI program, so a "
            "Core AI build takes a recipe with one scheme for every target (w8, w4, int8/B, "
            "int4/B, lutN)"
        )
    schemes = {target: recipe.scheme(target) for target in TARGETS}
    if len(set(schemes.values())) > 1:
        spelled = ", ".join(f"{target}={scheme.text}" for target, scheme in schemes.items())
        raise UnsupportedRecipe(
            f"quant: {name!r} gives its targets different schemes ({spelled}); coreai-opt's "
            "passes apply one scheme to every weight of a Core AI program, so a Core AI build "
            "takes a recipe with one scheme for every target (w8, w4, int8/B, int4/B, lutN)"
        )
    return CoreAIQuant(name, schemes["embed"])


@contextlib.contextmanager
def _pass_warnings() -> Iterator[list[str]]:
    """What the passes log: each weight they skip is a warning, and a skipped weight is
    refused, never published at fp16 under a quantized recipe's name."""
    skipped: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno >= logging.WARNING:
                skipped.append(record.getMessage().splitlines()[0])

    handler = Collect()
    loggers = [logging.getLogger(name) for name in PASS_LOGGERS]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        yield skipped
    finally:
        for logger in loggers:
            logger.removeHandler(handler)


def _coreai_utils() -> Any:
    """coreai-opt's Core AI passes; torchao (which it imports) prints about its GPU kernels."""
    with (
        warnings.catch_warnings(),
        contextlib.redirect_stdout(io.StringIO()),
        contextlib.redirect_stderr(io.StringIO()),
    ):
        warnings.simplefilter("ignore")
        logging.getLogger("torchao").setLevel(logging.ERROR)
        from coreai_opt import coreai_utils
    return coreai_utils


def quantize_program(program: Any, plan: CoreAIQuant) -> Any:
    """``program`` (an AIProgram, changed in place) with every weight compressed by ``plan``."""
    utils = _coreai_utils()
    scheme = plan.scheme
    with _pass_warnings() as skipped:
        if scheme.kind == "lut":
            utils.palettize_weights(
                program, lut_dtype=None, n_bits=scheme.bits,
                granularity=utils.CompressionGranularity.PER_TENSOR, in_place=True,
            )  # fmt: skip
        else:
            granularity = (
                utils.CompressionGranularity.PER_BLOCK
                if scheme.block
                else utils.CompressionGranularity.PER_CHANNEL
            )
            utils.quantize_weights(
                program, utils.DType.INT4 if scheme.kind == "int4" else utils.DType.INT8,
                qscheme=utils.QScheme.SYMMETRIC, granularity=granularity,
                block_size=scheme.block or 32, in_place=True,
            )  # fmt: skip
    if skipped:
        raise UnsupportedRecipe(
            f"quant: coreai-opt left {len(skipped)} weight(s) uncompressed under "
            f"{plan.recipe!r} ({skipped[0]}); a block size must divide every weight's input "
            "channels"
        )
    return program
