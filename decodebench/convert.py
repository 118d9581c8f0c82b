"""Convert a decode-step model to Core ML, behind a small interface so a backend can be added.

Today's backend is coremltools (TorchScript trace -> MIL -> ``.mlpackage``): an ML program for
iOS 18 with fp16 compute and the KV cache as Core ML states. The converted model's interface:

- inputs ``input_ids`` [1, 1] int32, ``position`` [1] int32, ``causal_mask`` [1, 1, 1, context]
  fp16 (see :mod:`decodebench.modeling`);
- output ``logits`` [1, 1, vocab] fp16;
- states ``key_cache_{i}`` / ``value_cache_{i}`` [1, Hkv, context, head_dim] fp16.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

import coremltools as ct
import numpy as np
import torch

from decodebench import coreml_compat
from decodebench.domain import VariantSpec
from decodebench.modeling import DecodeStepModel, step_inputs
from decodebench.presets import ModelConfig


class StageRecorder(Protocol):
    """Receives the named stages of a conversion (for timings and progress)."""

    def stage(self, name: str) -> contextlib.AbstractContextManager[None]: ...


class _NoStages:
    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        yield


class Converter(Protocol):
    name: str

    def versions(self) -> dict[str, str]:
        """Versions of everything that shapes the artifact (part of the build key)."""
        ...

    def convert(
        self,
        model: DecodeStepModel,
        config: ModelConfig,
        variant: VariantSpec,
        stages: StageRecorder | None = None,
    ) -> ct.models.MLModel: ...

    def save(self, converted: ct.models.MLModel, path: Path) -> None:
        """Write the artifact to ``path`` and release whatever the backend kept elsewhere."""
        ...


class ConversionError(ValueError):
    """The model and the variant disagree, or the backend refused the graph."""


class CoreMLToolsConverter:
    name = "coremltools"

    def versions(self) -> dict[str, str]:
        return {"torch": torch.__version__, "coremltools": ct.__version__}

    def convert(
        self,
        model: DecodeStepModel,
        config: ModelConfig,
        variant: VariantSpec,
        stages: StageRecorder | None = None,
    ) -> ct.models.MLModel:
        stages = stages or _NoStages()
        _check_matches(model, config, variant)
        coreml_compat.install()
        with stages.stage("trace"):
            # Tracing runs one real step, which writes position 0 of the cache; reset so the
            # module is left as it was handed to us.
            traced = coreml_compat.trace(model, step_inputs(0, 0, model.context, model.dtype))
            model.reset_cache()
        with stages.stage("convert"):
            return ct.convert(
                traced,
                inputs=_input_types(model),
                outputs=[ct.TensorType(name="logits", dtype=np.float16)],
                states=_state_types(model),
                convert_to="mlprogram",
                minimum_deployment_target=ct.target.iOS18,
                compute_precision=ct.precision.FLOAT16,
                # Linux cannot load Core ML models; a device compiles the package itself.
                skip_model_load=True,
            )

    def save(self, converted: ct.models.MLModel, path: Path) -> None:
        converted.save(str(path))
        # ct.convert writes the package to a temporary directory that coremltools deletes only
        # at interpreter exit: a long-lived build worker would keep gigabytes per build in /tmp.
        if converted.is_temp_package and converted.package_path:
            shutil.rmtree(converted.package_path, ignore_errors=True)


def _check_matches(model: DecodeStepModel, config: ModelConfig, variant: VariantSpec) -> None:
    if model.config != config:
        raise ConversionError(f"model was built for {model.config.name}, not {config.name}")
    if variant.layers is not None and variant.layers != config.num_layers:
        raise ConversionError(
            f"config has {config.num_layers} layers but the variant asks for {variant.layers}"
        )
    if model.context != variant.context:
        raise ConversionError(
            f"model has a {model.context}-token cache but the variant asks for {variant.context}"
        )
    if model.attention != variant.attention:
        raise ConversionError(
            f"model uses {model.attention.value} attention but the variant asks for "
            f"{variant.attention.value}"
        )


def _input_types(model: DecodeStepModel) -> list[ct.TensorType]:
    # Names must match the traced forward's argument order: input_ids, position, causal_mask.
    return [
        ct.TensorType(name="input_ids", shape=(1, 1), dtype=np.int32),
        ct.TensorType(name="position", shape=(1,), dtype=np.int32),
        ct.TensorType(name="causal_mask", shape=(1, 1, 1, model.context), dtype=np.float16),
    ]


def _state_types(model: DecodeStepModel) -> list[ct.StateType]:
    # Core ML states are fp16 only; the names tie each state to its torch buffer.
    return [
        ct.StateType(
            wrapped_type=ct.TensorType(shape=tuple(getattr(model, name).shape), dtype=np.float16),
            name=name,
        )
        for name in model.cache_names()
    ]


DEFAULT_CONVERTER: Converter = CoreMLToolsConverter()


def convert(
    model: DecodeStepModel,
    config: ModelConfig,
    variant: VariantSpec,
    stages: StageRecorder | None = None,
    converter: Converter = DEFAULT_CONVERTER,
) -> ct.models.MLModel:
    return converter.convert(model, config, variant, stages)
