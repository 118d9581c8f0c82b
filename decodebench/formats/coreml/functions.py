"""Which function of a package decodes a token, and which one prefills the prompt for it.

A package as converters make it may hold several functions: the project's own builds name them
``main`` (decode, the default) and ``prefill``; coremltools' multifunction save names them as the
user chose (``decode`` and ``prefill``, say) with a default function of its own. The decode
function is the one the analysis reads (:func:`decodebench.formats.coreml.graph.decode_function_name`:
one named like ``decode``, else the default, else ``main``); the prefill function is one named
like ``prefill`` whose states are the decode function's (it writes the cache the decode step
reads). Repair, headroom, verify and the doctor all choose through here.
"""

from __future__ import annotations

from typing import Any

from coremltools.converters.mil.mil import types
from coremltools.proto import Model_pb2

from decodebench.formats.coreml.graph import decode_function_name

PREFILL_WORD = "prefill"


def decode_function(spec: Model_pb2.Model, program: Any) -> str:
    """The decode function's name, as the analysis chooses it."""
    chosen = decode_function_name(spec)
    if chosen is not None and chosen in program.functions:
        return chosen
    return "main" if "main" in program.functions else sorted(program.functions)[0]


def _states(function: Any) -> dict[str, tuple[tuple[int, ...], str]]:
    found = {}
    for name, var in function.inputs.items():
        if types.is_state(var.sym_type):
            wrapped = var.sym_type.wrapped_type()
            shape = tuple(int(size) for size in wrapped.get_shape())
            found[name] = (shape, types.builtin_to_string(wrapped.get_primitive()))
    return found


def prefill_function(program: Any, decode: str) -> str | None:
    """The name of a function named like ``prefill`` sharing ``decode``'s states, if any."""
    states = _states(program.functions[decode])
    if not states:
        return None  # a cache passed in and out: no state for a prefill function to fill
    for name in sorted(program.functions):
        if name != decode and PREFILL_WORD in name.lower():
            if _states(program.functions[name]) == states:
                return name
    return None


def default_function(spec: Model_pb2.Model, program: Any) -> str:
    """The function a saved copy of ``program`` should default to: the spec's, if it has it."""
    default = spec.description.defaultFunctionName
    if default in program.functions:
        return default
    return "main" if "main" in program.functions else sorted(program.functions)[0]
