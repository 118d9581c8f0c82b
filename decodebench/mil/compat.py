"""Converter seams met while converting programs the project did not write (torch 2.13, ct 9.0).

Builds on :mod:`decodebench.coreml_compat` (the seams every conversion needs, the project's own
build path included); each workaround is named after what it fixes and covered by
``tests/decodebench/mil/test_compat.py``.

- ``aten::index_copy_``: Hugging Face's ``StaticCache`` writes new keys and values with
  ``cache.index_copy_(2, cache_position, states)``; coremltools 9.0 has no converter for it. A
  single index becomes ``slice_update`` (what the project's own builds use, so the analysis
  counts the written bytes the same way); several indices become ``scatter`` along the axis.
"""

from __future__ import annotations

from typing import Any

from coremltools.converters.mil import Builder as mb
from coremltools.converters.mil.frontend.torch.torch_op_registry import (
    _TORCH_OPS_REGISTRY,
    register_torch_op,
)

from decodebench import coreml_compat


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
    """Apply the project's converter workarounds and these; idempotent, call before converting."""
    coreml_compat.install()
    if _TORCH_OPS_REGISTRY.get_func("index_copy") is not _index_copy:
        register_torch_op(_index_copy, torch_alias=["index_copy"], override=True)


def installed() -> bool:
    return coreml_compat.installed() and _TORCH_OPS_REGISTRY.get_func("index_copy") is _index_copy
