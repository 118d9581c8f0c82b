"""A decoder (:class:`decodebench.modeling.DecodeStepModel`) as a Core AI asset.

The model is exported with ``torch.export`` and Core AI's decompositions, then converted by
coreai-torch into one program whose functions are the decode step (``main``) and, with a
prefill chunk, the prefill (``prefill``). The inputs and outputs keep the names of the Core ML
build (``input_ids``, ``position``, ``causal_mask``, ``key_cache_{i}`` ...; ``logits``,
``key_{i}`` ...), so the engine, the analysis and the phone drive either format alike.

The model is converted in the precision it was built in (the build path builds fp16), so the
program computes in fp16. A quantization recipe is then applied to the converted program by
coreai-opt (:mod:`decodebench.formats.coreai.quantize`): the weights are stored compressed and
expanded to fp16 by the ops it inserts; a recipe it cannot apply is refused by name before
anything is converted.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from decodebench.contracts.domain import KVCache, VariantSpec
from decodebench.contracts.presets import ModelConfig
from decodebench.contracts.recipes import RecipeError
from decodebench.formats.coreai.program import METADATA_KEY
from decodebench.formats.coreai.quantize import (
    CoreAIQuant,
    UnsupportedRecipe,
    plan_quantization,
    quantize_program,
)
from decodebench.formats.metadata import build_metadata
from decodebench.modeling import DecodeStepModel, example_inputs

PREFILL_FUNCTION = "prefill"
TOOLCHAIN_PACKAGES = ("torch", "coreai-core", "coreai-torch", "coreai-opt")


class ConversionError(ValueError):
    """The model and the variant disagree, or Core AI refused the graph."""


@contextlib.contextmanager
def quiet_coreai() -> Iterator[None]:
    """coreai-torch warns about torch's version and draws a progress bar; a build reports its
    own stages."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", module="coreai_torch")
        warnings.filterwarnings("ignore", category=FutureWarning)
        warnings.filterwarnings("ignore", message=".*validated with torch.*")
        previous = logging.getLogger("coreai_torch").level
        logging.getLogger("coreai_torch").setLevel(logging.ERROR)
        try:
            yield
        finally:
            logging.getLogger("coreai_torch").setLevel(previous)


def input_names(model: DecodeStepModel) -> list[str]:
    names = ["input_ids", "position"]
    if model.query_length == 1:
        names.append("causal_mask")
    if model.kv == KVCache.input:
        names += model.cache_names()
    return names


def output_names(model: DecodeStepModel) -> list[str]:
    names = ["logits"]
    if model.kv == KVCache.input:
        names += model.new_kv_names()
    return names


def check_variant(config: ModelConfig, variant: VariantSpec) -> None:
    """What Core AI builds today; ConversionError naming the field otherwise."""
    if variant.kv != KVCache.input:
        raise ConversionError(
            "kv: a Core AI build keeps its KV cache as inputs for now (kv=input); "
            "K/V as Core AI states is not converted yet"
        )
    quantization(variant)
    if variant.kv_window:
        raise ConversionError("kv_window: the windowed KV layout is Core ML only for now")
    del config


def quantization(variant: VariantSpec) -> CoreAIQuant | None:
    """The coreai-opt pass the variant's recipe asks for (None for fp16); ConversionError
    naming a recipe coreai-opt cannot apply."""
    if variant.quant in ("fp16", "float16"):
        return None
    try:
        return plan_quantization(variant.quant)
    except (UnsupportedRecipe, RecipeError) as error:
        raise ConversionError(str(error)) from None


def _exported(model: DecodeStepModel) -> Any:
    import coreai_torch

    arguments = example_inputs(model)
    with torch.no_grad():
        program = torch.export.export(model, tuple(arguments))
    return program.run_decompositions(coreai_torch.get_decomp_table())


def build_asset(
    functions: dict[str, Any],
    config: ModelConfig,
    variant: VariantSpec,
    path: Path,
    stages: Any = None,
) -> dict[str, str]:
    """Convert ``functions`` (name -> decoder, consumed) into the asset at ``path``."""
    check_variant(config, variant)
    quant = quantization(variant)
    stage = stages.stage if stages is not None else (lambda name: contextlib.nullcontext())
    with quiet_coreai():
        import coreai_torch  # noqa: F401 - imported here so its warning is silenced
        from coreai_torch import TorchConverter

        converter = TorchConverter(mode=TorchConverter.Mode.RELEASE)
        for name in list(functions):
            model = functions.pop(name)
            _check_matches(model, config, variant)
            with stage("trace"):
                exported = _exported(model)
            converter.add_exported_program(
                exported,
                input_names=input_names(model),
                output_names=output_names(model),
                entrypoint_name=name,
            )
            del model
        with stage("convert"), open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):
            program = converter.to_coreai()
        if quant is not None:
            with stage("quantize"):
                try:
                    quantize_program(program, quant)
                except UnsupportedRecipe as error:
                    raise ConversionError(str(error)) from None
        with stage("save"):
            _save(program, path, build_metadata(config, variant))
    return {}


def _save(program: Any, path: Path, metadata: dict[str, str]) -> None:
    from coreai.authoring.asset import AIModelAsset

    path.parent.mkdir(parents=True, exist_ok=True)
    program.save_asset(path)
    if metadata:
        asset = AIModelAsset.load(path)
        text = json.dumps(metadata, sort_keys=True)
        asset.update_metadata(lambda held: held.set_custom(METADATA_KEY, text))


def _check_matches(model: DecodeStepModel, config: ModelConfig, variant: VariantSpec) -> None:
    if model.config != config:
        raise ConversionError(f"model was built for {model.config.name}, not {config.name}")
    if model.context != variant.context or model.attention != variant.attention:
        raise ConversionError(
            f"model has a {model.context}-token cache and {model.attention.value} attention; "
            f"the variant asks for {variant.context} and {variant.attention.value}"
        )
    if model.kv != variant.kv:
        raise ConversionError(
            f"model keeps its KV cache as {model.kv.value}, the variant asks for {variant.kv.value}"
        )


def convert_preset(
    config: ModelConfig, variant: VariantSpec, path: Path, dtype: torch.dtype = torch.float16
) -> Path:
    """A preset's decoder (random weights from its seed) as an asset: for tests and benchmarks."""
    functions: dict[str, Any] = {
        "main": DecodeStepModel(config, variant.context, variant.attention, dtype, variant.kv)
    }
    if variant.prefill_chunk is not None:
        functions[PREFILL_FUNCTION] = functions["main"].sibling(variant.prefill_chunk)
    build_asset(functions, config, variant, path)
    return path
