"""The Core ML interface of a decode step: the inputs, outputs and states a converted program
has, from :mod:`decodebench.modeling`'s model (the converter, tests and benchmarks build the
same program from these)."""

from __future__ import annotations

import coremltools as ct
import numpy as np

from decodebench.contracts.domain import KVCache
from decodebench.modeling import DecodeStepModel


def input_types(model: DecodeStepModel) -> list[ct.TensorType]:
    """The program's inputs; names must match the traced forward's argument order."""
    length = model.query_length
    types = [
        ct.TensorType(name="input_ids", shape=(1, length), dtype=np.int32),
        ct.TensorType(name="position", shape=(1,), dtype=np.int32),
    ]
    if length == 1:
        types.append(
            ct.TensorType(name="causal_mask", shape=(1, 1, 1, model.context), dtype=np.float16)
        )
    if model.kv == KVCache.input:
        types += [
            ct.TensorType(name=name, shape=model.cache_shape(number // 2), dtype=np.float16)
            for number, name in enumerate(model.cache_names())
        ]
    return types


def output_types(model: DecodeStepModel) -> list[ct.TensorType]:
    outputs = [ct.TensorType(name="logits", dtype=np.float16)]
    if model.kv == KVCache.input:
        outputs += [ct.TensorType(name=name, dtype=np.float16) for name in model.new_kv_names()]
    return outputs


def state_types(model: DecodeStepModel) -> list[ct.StateType]:
    if model.kv != KVCache.state:
        return []
    # Core ML states are fp16 only; the names tie each state to its torch buffer.
    return [
        ct.StateType(
            wrapped_type=ct.TensorType(shape=model.cache_shape(number // 2), dtype=np.float16),
            name=name,
        )
        for number, name in enumerate(model.cache_names())
    ]
