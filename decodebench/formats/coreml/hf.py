"""Convert one decode step of a Hugging Face ``transformers`` causal LM, as its authors wrote it.

This is how a user's own model reaches Core ML without the project's modeling code: the
model's forward runs unchanged with a ``transformers.StaticCache`` whose key/value tensors are
registered as buffers, so coremltools turns them into states. The step's interface is the
project's (``input_ids`` [1, 1], ``position`` [1], ``causal_mask`` [1, 1, 1, ctx] additive,
``logits``), but every op in between is transformers'.

Two adapters, both outside the model: each cache layer's write offset is the ``position``
input (``StaticLayer`` keeps it in ``cumulative_length``, which would otherwise be traced as a
constant), and the 4-D additive mask is passed as ``attention_mask``, which transformers
uses as given. ``cache.index_copy_`` needs :mod:`decodebench.formats.coreml.compat`.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import coremltools as ct
import numpy as np
import torch
from torch import nn

from decodebench.formats.coreml import compat


class StaticCacheDecodeStep(nn.Module):
    def __init__(self, model: Any, context: int) -> None:
        from transformers import StaticCache
        from transformers.cache_utils import StaticLayer

        super().__init__()
        self.model = model
        self.context = context
        config = model.config
        self.kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or (
            config.hidden_size // config.num_attention_heads
        )
        dtype = next(model.parameters()).dtype
        self.cache = StaticCache(config=config, max_cache_len=context)
        self.cache.early_initialization(1, self.kv_heads, self.head_dim, dtype, torch.device("cpu"))
        self.layers: list[StaticLayer] = []
        for index, layer in enumerate(self.cache.layers):
            if not isinstance(layer, StaticLayer):  # sliding-window or linear-attention layers
                raise ValueError(
                    f"cache layer {index} is a {type(layer).__name__}, not a StaticLayer"
                )
            self.layers.append(layer)
            # The same tensors the cache writes in place: buffers become Core ML states.
            self.register_buffer(f"key_cache_{index}", layer.keys, persistent=False)
            self.register_buffer(f"value_cache_{index}", layer.values, persistent=False)

    def cache_names(self) -> list[str]:
        return [
            f"{kind}_cache_{i}" for i in range(len(self.cache.layers)) for kind in ("key", "value")
        ]

    def reset_cache(self) -> None:
        for name in self.cache_names():
            getattr(self, name).zero_()

    def forward(
        self, input_ids: torch.Tensor, position: torch.Tensor, causal_mask: torch.Tensor
    ) -> torch.Tensor:
        for layer in self.layers:
            layer.cumulative_length = position.clone()
        output = self.model(
            input_ids=input_ids,
            attention_mask=causal_mask.to(next(self.model.parameters()).dtype),
            position_ids=position[None],
            cache=self.cache,
            use_cache=True,
        )
        return output.logits


def example_inputs(context: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    mask = torch.full((1, 1, 1, context), float("-inf"))
    mask[..., :1] = 0
    return torch.tensor([[0]], dtype=torch.int32), torch.tensor([0], dtype=torch.int32), mask


def _token_inputs(context: int | None, tokens: int = 1) -> list[ct.TensorType]:
    inputs = [
        ct.TensorType(name="input_ids", shape=(1, tokens), dtype=np.int32),
        ct.TensorType(name="position", shape=(1,), dtype=np.int32),
    ]
    if context is not None:
        inputs.append(ct.TensorType(name="causal_mask", shape=(1, 1, 1, context), dtype=np.float16))
    return inputs


def _convert_fp16(
    traced: Any,
    inputs: list[ct.TensorType],
    outputs: list[str],
    states: list[ct.StateType] | None = None,
    pass_pipeline: ct.PassPipeline | None = None,
) -> ct.models.MLModel:
    """An iOS 18 fp16 ML program of a trace (iOS 18: the index_copy_ seam emits slice_update)."""
    return ct.convert(
        traced,
        inputs=inputs,
        outputs=[ct.TensorType(name=name, dtype=np.float16) for name in outputs],
        states=states,
        convert_to="mlprogram",
        minimum_deployment_target=ct.target.iOS18,
        compute_precision=ct.precision.FLOAT16,
        pass_pipeline=pass_pipeline,
        skip_model_load=True,
    )


def _cache_states(step: StaticCacheDecodeStep) -> list[ct.StateType]:
    shape = (1, step.kv_heads, step.context, step.head_dim)
    return [
        ct.StateType(wrapped_type=ct.TensorType(shape=shape, dtype=np.float16), name=name)
        for name in step.cache_names()
    ]


def convert_decode_step(
    step: StaticCacheDecodeStep, pass_pipeline: ct.PassPipeline | None = None
) -> ct.models.MLModel:
    """Trace and convert ``step`` to an iOS 18 fp16 ML program with the cache as states."""
    compat.install()
    traced = compat.trace(step.eval(), example_inputs(step.context))
    step.reset_cache()
    return _convert_fp16(
        traced, _token_inputs(step.context), ["logits"], _cache_states(step), pass_pipeline
    )


class _CacheAsInputs(nn.Module):
    """The step with the cache passed in and out instead of held (no buffers)."""

    def __init__(self, model: Any, context: int) -> None:
        super().__init__()
        self.step = StaticCacheDecodeStep(model, context)

    def forward(
        self,
        input_ids: torch.Tensor,
        position: torch.Tensor,
        causal_mask: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        for index, layer in enumerate(self.step.layers):
            layer.keys = key_cache[index].clone()
            layer.values = value_cache[index].clone()
        logits = self.step(input_ids, position, causal_mask)
        keys = torch.stack([_filled(layer.keys) for layer in self.step.layers])
        values = torch.stack([_filled(layer.values) for layer in self.step.layers])
        return logits, keys, values


def _filled(cache: torch.Tensor | None) -> torch.Tensor:
    if cache is None:
        raise RuntimeError("the decode step left a layer's cache unset")
    return cache


def convert_cache_as_inputs(model: Any, context: int) -> ct.models.MLModel:
    """The older layout: one K and one V cache for all layers passed in as inputs
    (``[layers, 1, kv heads, context, head dim]``) and out again whole, updated."""
    wrapper = _CacheAsInputs(model, context).eval()
    step = wrapper.step
    shape = (len(step.layers), 1, step.kv_heads, context, step.head_dim)
    caches = (torch.zeros(shape), torch.zeros(shape))
    compat.install()
    traced = compat.trace(wrapper, (*example_inputs(context), *caches))
    inputs = _token_inputs(context) + [
        ct.TensorType(name=name, shape=shape, dtype=np.float16)
        for name in ("key_cache", "value_cache")
    ]
    return _convert_fp16(traced, inputs, ["logits", "key_cache_out", "value_cache_out"])


class _PrefillStep(StaticCacheDecodeStep):
    """``chunk`` tokens at once; the causal mask is built in the graph from ``position``."""

    def __init__(self, model: Any, context: int, chunk: int) -> None:
        super().__init__(model, context)
        self.chunk = chunk

    def forward(  # type: ignore[override]
        self, input_ids: torch.Tensor, position: torch.Tensor
    ) -> torch.Tensor:
        positions = position + torch.arange(self.chunk, dtype=position.dtype)
        columns = torch.arange(self.context, dtype=position.dtype)
        allowed = columns[None, :] <= positions[:, None]
        mask = torch.where(allowed, 0.0, float("-inf"))[None, None]
        for layer in self.layers:
            layer.cumulative_length = position.clone()
        output = self.model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=positions[None],
            cache=self.cache,
            use_cache=True,
        )
        return output.logits


def convert_multifunction(
    model: Any,
    target: Path,
    context: int = 64,
    chunk: int = 4,
    names: tuple[str, str] = ("decode", "prefill"),
    prefill_model: Any | None = None,
) -> None:
    """``model`` as coremltools' multifunction save makes it: two conversions of the same
    weights (the one-token decode step, and a prefill step of ``chunk`` tokens), merged into
    one package whose functions are ``names`` (decode first, the default), sharing the KV
    states.

    ``prefill_model``: another model of the same shape for the prefill function (a package
    whose prefill misbehaves where its decode step does not)."""
    decode_name, prefill_name = names
    with tempfile.TemporaryDirectory() as staging:
        parts = {decode_name: Path(staging) / "decode.mlpackage"}
        convert_decode_step(StaticCacheDecodeStep(model, context)).save(str(parts[decode_name]))
        prefill = _PrefillStep(prefill_model or model, context, chunk).eval()
        compat.install()
        example = (torch.zeros((1, chunk), dtype=torch.int32), torch.zeros(1, dtype=torch.int32))
        traced = compat.trace(prefill, example)
        prefill.reset_cache()
        converted = _convert_fp16(
            traced, _token_inputs(None, chunk), ["logits"], _cache_states(prefill)
        )
        parts[prefill_name] = Path(staging) / "prefill.mlpackage"
        converted.save(str(parts[prefill_name]))
        descriptor = ct.utils.MultiFunctionDescriptor()
        for name, path in parts.items():
            descriptor.add_function(str(path), src_function_name="main", target_function_name=name)
        descriptor.default_function_name = decode_name
        replace_directory(target)
        ct.utils.save_multifunction(descriptor, str(target))


def replace_directory(target: Path) -> None:
    """Make way for a package saved at ``target`` (its parent made, an old one removed)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists():
        shutil.rmtree(target)
