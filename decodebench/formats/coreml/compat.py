"""Seams between torch 2.13 and coremltools 9.0 (tested by Apple up to torch 2.7), in one place.

Each workaround is small, named after what it fixes, and covered by
tests/decodebench/formats/coreml/test_compat_trace.py and test_compat.py. Delete one when the
pinned versions no longer need it (the tests say when).

- ``trace``: torch 2.13 deprecates TorchScript tracing, which coremltools 9.0 still converts
  stateful models from most reliably; only that warning is silenced.
- ``aten::Int`` on a rank-1 constant (traced shape arithmetic): take the single element.
- ``aten::index_copy_``: Hugging Face's ``StaticCache`` writes new keys and values with
  ``cache.index_copy_(2, cache_position, states)``; coremltools 9.0 has no converter for it. A
  single index becomes ``slice_update`` (what the project's own builds use, so the analysis
  counts the written bytes the same way); several indices become ``scatter`` along the axis.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from coremltools.converters.mil import Builder as mb
from coremltools.converters.mil.frontend.torch.torch_op_registry import (
    _TORCH_OPS_REGISTRY,
    register_torch_op,
)

# torch 2.13 deprecates TorchScript tracing, but coremltools 9.0 converts stateful models
# (KV cache as ct.StateType) most reliably from a TorchScript trace; the warning is noise for us
# and would fail any run with warnings as errors.
_TRACE_DEPRECATION = r"`torch\.jit\.trace(_method)?` is deprecated"


def trace(
    model: torch.nn.Module, example_inputs: tuple[torch.Tensor, ...], check_trace: bool = True
) -> torch.jit.ScriptModule:
    """``torch.jit.trace`` without torch 2.13's deprecation warning (and only that warning).

    ``check_trace=False`` skips re-running the model twice to compare (10+ s on EXAONE); our
    forward has no data-dependent control flow for the check to catch.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_TRACE_DEPRECATION, category=DeprecationWarning)
        return torch.jit.trace(model, example_inputs, check_trace=check_trace)


def single_int(value: Any) -> int:
    """The one element of a scalar or a size-1 array, as a Python int."""
    array = np.asarray(value)
    if array.size != 1:
        raise ValueError(f"aten::Int needs a single element, got shape {array.shape}")
    return int(array.reshape(-1)[0])


_original_int_converter: Callable[[Any, Any], None] | None = None


def _int(context: Any, node: Any) -> None:
    # Traced shape arithmetic (`x.shape[-1] // 2`, `heads * n_rep`) reaches aten::Int as a
    # rank-1 constant; coremltools 9.0 calls int() on that array, which NumPy deprecates
    # (an error under warnings-as-errors, and in future NumPy). Take the single element instead.
    value = context[node.inputs[0]]
    if value.can_be_folded_to_const():
        context.add(mb.const(val=single_int(value.val), name=node.name), node.name)
        return
    assert _original_int_converter is not None
    _original_int_converter(context, node)


def _index_copy(context: Any, node: Any) -> None:
    data = context[node.inputs[0]]
    axis = int(context[node.inputs[1]].val)
    index = context[node.inputs[2]]
    source = context[node.inputs[3]]
    if axis < 0:
        axis += data.rank
    if index.rank == 0:
        index = mb.expand_dims(x=index, axes=[0])
    index = mb.cast(x=index, dtype="int32")
    if index.shape == (1,):
        # One position: a slice [index, index + 1) along the axis, every other axis whole.
        begin = [0] * data.rank
        end = list(data.shape)
        begin[axis] = index
        end[axis] = mb.add(x=index, y=1)
        begin_var = mb.concat(values=[_as_vector(value) for value in begin], axis=0)
        end_var = mb.concat(values=[_as_vector(value) for value in end], axis=0)
        result = mb.slice_update(
            x=data, update=source, begin=begin_var, end=end_var, name=node.name
        )
    else:
        result = mb.scatter(
            data=data, indices=index, updates=source, axis=axis, mode="update", name=node.name
        )
    context.add(result)


def _as_vector(value: Any) -> Any:
    if isinstance(value, int):
        return mb.const(val=[value])
    return value


def install() -> None:
    """Apply every workaround to coremltools; idempotent, call before converting."""
    global _original_int_converter
    current = _TORCH_OPS_REGISTRY.get_func("int")
    if current is not _int:
        _original_int_converter = current
        register_torch_op(_int, torch_alias=["int"], override=True)
    if _TORCH_OPS_REGISTRY.get_func("index_copy") is not _index_copy:
        register_torch_op(_index_copy, torch_alias=["index_copy"], override=True)


def installed() -> bool:
    return (
        _TORCH_OPS_REGISTRY.get_func("int") is _int
        and _TORCH_OPS_REGISTRY.get_func("index_copy") is _index_copy
    )
