"""Convert one decode step of a Hugging Face ``transformers`` causal LM, as its authors wrote it.

This is how a user's own model reaches Core ML without the project's modeling code: the
model's forward runs unchanged with a ``transformers.StaticCache`` whose key/value tensors are
registered as buffers, so coremltools turns them into states. The step's interface is the
project's (``input_ids`` [1, 1], ``position`` [1], ``causal_mask`` [1, 1, 1, ctx] additive,
``logits``), but every op in between is transformers'.

Two adapters, both outside the model: each cache layer's write offset is the ``position``
input (``StaticLayer`` keeps it in ``cumulative_length``, which would otherwise be traced as a
constant), and the 4-D additive mask is passed as ``attention_mask``, which transformers
uses as given. ``cache.index_copy_`` needs :mod:`decodebench.mil.compat`.
"""

from __future__ import annotations

from typing import Any

import coremltools as ct
import numpy as np
import torch
from torch import nn

from decodebench import coreml_compat
from decodebench.mil import compat


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


def convert_decode_step(
    step: StaticCacheDecodeStep, pass_pipeline: ct.PassPipeline | None = None
) -> ct.models.MLModel:
    """Trace and convert ``step`` to an iOS 18 fp16 ML program with the cache as states."""
    compat.install()
    traced = coreml_compat.trace(step.eval(), example_inputs(step.context))
    step.reset_cache()
    cache_shape = (1, step.kv_heads, step.context, step.head_dim)
    return ct.convert(
        traced,
        inputs=[
            ct.TensorType(name="input_ids", shape=(1, 1), dtype=np.int32),
            ct.TensorType(name="position", shape=(1,), dtype=np.int32),
            ct.TensorType(name="causal_mask", shape=(1, 1, 1, step.context), dtype=np.float16),
        ],
        outputs=[ct.TensorType(name="logits", dtype=np.float16)],
        states=[
            ct.StateType(wrapped_type=ct.TensorType(shape=cache_shape, dtype=np.float16), name=name)
            for name in step.cache_names()
        ],
        convert_to="mlprogram",
        minimum_deployment_target=ct.target.iOS18,
        compute_precision=ct.precision.FLOAT16,
        pass_pipeline=pass_pipeline,
        skip_model_load=True,
    )
