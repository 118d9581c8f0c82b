"""A model's measured sensitivity ranking, reused across its variants through the build cache.

The ranking depends on the model (identity and config), the base schemes tried, the calibration
and how it was computed, never on context, attention layout, KV or prefill: so only a model's
first build measures it, and its other variants read it back (``measured_by`` names the build
that measured it).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from decodebench.building.cache import BuildCache, ranking_key
from decodebench.contracts.build import METHOD, LayerSensitivity, SensitivityReport
from decodebench.contracts.presets import ModelConfig
from decodebench.contracts.recipes import QuantRecipe
from decodebench.formats.coreml.quant.apply import QuantPlan
from decodebench.formats.coreml.quant.sensitivity import (
    CALIBRATION_PROMPTS,
    CALIBRATION_TOKENS,
    arithmetic_for,
    measure,
    promoted_layers,
    rank,
)
from decodebench.modeling import DecodeStepModel
from decodebench.prompts import prompt_set_digest


def measurement(
    config: ModelConfig, recipe: QuantRecipe, toolchain: dict[str, str]
) -> dict[str, object]:
    """Everything a ranking depends on besides the model identity (its cache key's content)."""
    return {
        "config": config.model_dump(mode="json"),
        "schemes": {"attn": recipe.attn.text, "ffn": recipe.ffn.text},
        "calibration": {
            "prompt_set": prompt_set_digest(),
            "prompts": CALIBRATION_PROMPTS,
            "tokens": CALIBRATION_TOKENS,
        },
        "method": METHOD,
        "arithmetic": arithmetic_for(config.family),
        "toolchain": toolchain,
    }


def sensitivity_report(
    model: DecodeStepModel,
    plan: QuantPlan,
    identity: str,
    build_key: str,
    toolchain: dict[str, str],
    cache: BuildCache | None,
    progress: Callable[[float], None] | None = None,
) -> SensitivityReport:
    """The ranking for ``plan``'s recipe: measured, or read back when this model was measured
    the same way before (and stored for next time when there is a cache)."""
    recipe = plan.recipe
    key = ranking_key(identity, measurement(model.config, recipe, toolchain))
    stored = cache.ranking(key) if cache is not None else None
    if stored is not None:
        ranking = [LayerSensitivity.model_validate(item) for item in stored["ranking"]]
        seconds, measured_by = float(stored["seconds"]), str(stored["measured_by"])
    else:
        started = time.perf_counter()
        ranking = rank(measure(model, plan, progress=progress))
        seconds, measured_by = round(time.perf_counter() - started, 3), build_key
        if cache is not None:
            cache.store_ranking(
                key,
                {
                    "ranking": [item.model_dump() for item in ranking],
                    "seconds": seconds,
                    "measured_by": build_key,
                },
            )
    return SensitivityReport(
        schemes={"attn": recipe.attn.text, "ffn": recipe.ffn.text},
        calibration=(
            f"{CALIBRATION_PROMPTS} builtin prompts x {CALIBRATION_TOKENS} tokens, pseudo-tokenized"
        ),
        tokens=CALIBRATION_PROMPTS * CALIBRATION_TOKENS,
        ranking=ranking,
        promoted=sorted(promoted_layers(recipe, ranking)),
        seconds=seconds,
        arithmetic=arithmetic_for(model.config.family),
        measured_by=None if measured_by == build_key else measured_by,
    )
