"""A Llama-family GQA decoder shaped for Core ML: a fixed number of query tokens per call.

One model class serves every variant axis that changes the graph, each axis a small strategy:

- ``query_length`` 1 is the **decode** step; ``query_length`` C > 1 is a **prefill** chunk.
- the attention layout (:mod:`~decodebench.modeling.layouts`): ``repeat_kv`` replicates the KV
  heads (a ``tile`` in MIL), ``folded`` reshapes the query instead;
- the KV mode (:mod:`~decodebench.modeling.kv_modes`): ``state`` keeps the cache in the model
  (Core ML states), ``input`` takes it as input and returns each call's new K and V.

:mod:`~decodebench.modeling.decoder` assembles the model and documents its inputs and outputs;
:mod:`~decodebench.modeling.host` holds what the host does around a call (masks, its cache,
greedy decoding); :mod:`~decodebench.modeling.layers` the blocks no axis changes.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from decodebench.modeling.attention import GroupedQueryAttention
    from decodebench.modeling.decoder import (
        INIT_STD,
        MASKED,
        DecoderLayer,
        DecodeStepModel,
        build_model,
        parameter_seed,
    )
    from decodebench.modeling.host import (
        HostCache,
        causal_mask,
        example_inputs,
        greedy_decode,
        parameter_count,
        run_call,
        step_inputs,
    )
    from decodebench.modeling.kv_modes import KVMode, kv_mode
    from decodebench.modeling.layers import MLP, RMSNorm, inverse_frequencies, rope_tables
    from decodebench.modeling.layouts import AttentionLayout, layout_for

# Resolved on first use: the family catalog (names, tensor shapes) is read by the torch-free
# server through decodebench.building.weights, and importing this package must not load torch.
_LOCATIONS = {
    "GroupedQueryAttention": "decodebench.modeling.attention",
    "INIT_STD": "decodebench.modeling.decoder",
    "MASKED": "decodebench.modeling.decoder",
    "DecoderLayer": "decodebench.modeling.decoder",
    "DecodeStepModel": "decodebench.modeling.decoder",
    "build_model": "decodebench.modeling.decoder",
    "parameter_seed": "decodebench.modeling.decoder",
    "HostCache": "decodebench.modeling.host",
    "causal_mask": "decodebench.modeling.host",
    "example_inputs": "decodebench.modeling.host",
    "greedy_decode": "decodebench.modeling.host",
    "parameter_count": "decodebench.modeling.host",
    "run_call": "decodebench.modeling.host",
    "step_inputs": "decodebench.modeling.host",
    "KVMode": "decodebench.modeling.kv_modes",
    "kv_mode": "decodebench.modeling.kv_modes",
    "MLP": "decodebench.modeling.layers",
    "RMSNorm": "decodebench.modeling.layers",
    "inverse_frequencies": "decodebench.modeling.layers",
    "rope_tables": "decodebench.modeling.layers",
    "AttentionLayout": "decodebench.modeling.layouts",
    "layout_for": "decodebench.modeling.layouts",
}


def __getattr__(name: str) -> Any:
    if name not in _LOCATIONS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_LOCATIONS[name]), name)
    globals()[name] = value
    return value


__all__ = [
    "INIT_STD",
    "MASKED",
    "MLP",
    "AttentionLayout",
    "DecodeStepModel",
    "DecoderLayer",
    "GroupedQueryAttention",
    "HostCache",
    "KVMode",
    "RMSNorm",
    "build_model",
    "causal_mask",
    "example_inputs",
    "greedy_decode",
    "inverse_frequencies",
    "kv_mode",
    "layout_for",
    "parameter_count",
    "parameter_seed",
    "rope_tables",
    "run_call",
    "step_inputs",
]
