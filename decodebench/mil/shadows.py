"""fp32 shadows of fp16 state storage (the KV cache), so attention stops widening the cache.

Every op computes in fp32, so each attention ``matmul`` reading an fp16 KV cache used to widen
the whole cache (a SmolLM2 step widened its 60 caches: ~40 % of the attention's time). A state
whose storage the interpreter updates in place (a ``read_state`` -> ``slice_update`` ->
``coreml_update_state`` chain, see :mod:`decodebench.mil.plan`) gets an fp32 copy here, made once;
the interpreter writes every slice it writes into the state into its shadow too, and an op
reading the state is given the shadow instead of a fresh widening. Bit-identical: fp16 -> fp32
is exact, so the shadow holds exactly what widening the state would give.

The registry is shared by every interpreter of the process (a package's decode and prefill
functions update the same states), keyed by the storage array itself (held weakly: a state
dropped, or replaced by a new array, loses its shadow). The states' storage is written only by
interpreters: a caller writing into a state array in place must call :func:`forget` for it.
"""

from __future__ import annotations

import functools
import weakref
from typing import Any

import numpy as np

FP16 = np.dtype(np.float16)
# fp32 shadows are kept up to this many bytes in all; states past it are widened on each read.
SHADOW_BUDGET = 1 * 2**30

_shadows: dict[int, tuple[weakref.ref[np.ndarray], np.ndarray]] = {}
_bytes = 0


def track(storage: np.ndarray) -> None:
    """Give an fp16 state's storage an fp32 shadow (once), within the budget."""
    global _bytes
    key = id(storage)
    found = _shadows.get(key)
    if found is not None and found[0]() is storage:
        return
    if storage.dtype != FP16 or _bytes + 2 * storage.nbytes > SHADOW_BUDGET:
        return
    if found is not None:
        _drop(key)
    _shadows[key] = (
        weakref.ref(storage, functools.partial(_dropped, key)),
        storage.astype(np.float32),
    )
    _bytes += 2 * storage.nbytes


def shadow(value: Any) -> np.ndarray | None:
    """The fp32 shadow of ``value`` if it is a tracked state's storage."""
    found = _shadows.get(id(value))
    if found is None or found[0]() is not value:
        return None
    return found[1]


def write(storage: np.ndarray, index: Any) -> None:
    """After ``storage[index] = update``: the same slice of its shadow, if it has one."""
    found = shadow(storage)
    if found is not None:
        found[index] = storage[index]


def forget(storage: np.ndarray) -> None:
    """Drop a storage's shadow (after writing into it outside an interpreter)."""
    if shadow(storage) is not None:
        _drop(id(storage))


def _dropped(key: int, _: object) -> None:
    _drop(key)


def _drop(key: int) -> None:
    global _bytes
    found = _shadows.pop(key, None)
    if found is not None:
        _bytes -= found[1].nbytes
