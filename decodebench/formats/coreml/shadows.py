"""fp32 shadows of fp16 state storage (the KV cache), so attention stops widening the cache.

Every op computes in fp32, so each attention ``matmul`` reading an fp16 KV cache used to widen
the whole cache (a SmolLM2 step widened its 60 caches: ~40 % of the attention's time). A state
whose storage the interpreter updates in place (a ``read_state`` -> ``slice_update`` ->
``coreml_update_state`` chain, see :mod:`decodebench.formats.coreml.plan`) gets an fp32 copy here, made once;
the interpreter writes every slice it writes into the state into its shadow too, and an op
reading the state is given the shadow instead of a fresh widening. Bit-identical: fp16 -> fp32
is exact, so the shadow holds exactly what widening the state would give.

The registry is shared by every interpreter of the process (a package's decode and prefill
functions update the same states), keyed by the storage array itself (held weakly: a state
dropped, or replaced by a new array, loses its shadow). The states' storage is written only by
interpreters: a caller writing into a state array in place must call :func:`forget` for it.

Each shadow also remembers whether its storage is known to hold only finite values: set once
the whole storage has been checked (:func:`mark_finite`), kept while every slice written into it
is finite (:func:`write` checks the slice), dropped otherwise. The non-finite check of a state
read or written in place then costs nothing instead of a pass over the whole cache (four per
layer per step).
"""

from __future__ import annotations

import functools
import math
import weakref
from typing import Any

import numpy as np

FP16 = np.dtype(np.float16)
# fp32 shadows are kept up to this many bytes in all; states past it are widened on each read.
SHADOW_BUDGET = 1 * 2**30


class _Shadow:
    __slots__ = ("finite", "ref", "wide")

    def __init__(self, ref: weakref.ref[np.ndarray], wide: np.ndarray) -> None:
        self.ref = ref
        self.wide = wide
        self.finite = False  # the whole storage checked finite since its last write


_shadows: dict[int, _Shadow] = {}
_bytes = 0


def track(storage: np.ndarray) -> None:
    """Give an fp16 state's storage an fp32 shadow (once), within the budget."""
    global _bytes
    key = id(storage)
    found = _shadows.get(key)
    if found is not None and found.ref() is storage:
        return
    if storage.dtype != FP16 or _bytes + 2 * storage.nbytes > SHADOW_BUDGET:
        return
    if found is not None:
        _drop(key)
    _shadows[key] = _Shadow(
        weakref.ref(storage, functools.partial(_dropped, key)), storage.astype(np.float32)
    )
    _bytes += 2 * storage.nbytes


def shadow(value: Any) -> np.ndarray | None:
    """The fp32 shadow of ``value`` if it is a tracked state's storage."""
    found = _shadows.get(id(value))
    if found is None or found.ref() is not value:
        return None
    return found.wide


def _entry(value: Any) -> _Shadow | None:
    found = _shadows.get(id(value))
    if found is None or found.ref() is not value:
        return None
    return found


def known_finite(value: Any) -> bool:
    """Whether ``value`` is a tracked storage known to hold only finite values."""
    found = _entry(value)
    return found is not None and found.finite


def mark_finite(value: Any) -> None:
    """``value`` (a tracked storage) was just checked whole: it holds only finite values."""
    found = _entry(value)
    if found is not None:
        found.finite = True


def write(storage: np.ndarray, index: Any) -> None:
    """After ``storage[index] = update``: the same slice of its shadow, if it has one; the
    storage stays known finite only if the slice written is (its fp32 sum of squares is finite:
    finite fp16 values cannot overflow it)."""
    found = _entry(storage)
    if found is not None:
        found.wide[index] = storage[index]
        if found.finite:
            written = found.wide[index]
            found.finite = math.isfinite(np.vdot(written, written))


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
        _bytes -= found.wide.nbytes
