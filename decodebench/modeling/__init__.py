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
