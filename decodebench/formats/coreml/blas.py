"""How many threads NumPy's OpenBLAS uses while the interpreter runs a step.

A decode step's products are matrix-vector ones: memory-bound, and short (a SmolLM2 step has
211 of them). On a shared 2-core machine OpenBLAS's worker threads spin and wait for cores more
than they compute: measured on SmolLM2-135M fp16, one thread decodes 4x faster than the default
(see docs/interpreter.md). The thread count is set for the duration of a step and restored
after, and changes no bits: OpenBLAS splits a product between threads by output rows and
columns, never along the summed axis.

When NumPy's BLAS is not an OpenBLAS this module can find, nothing is changed.
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

_SYMBOLS = (
    ("scipy_openblas_get_num_threads64_", "scipy_openblas_set_num_threads64_"),
    ("openblas_get_num_threads64_", "openblas_set_num_threads64_"),
    ("openblas_get_num_threads", "openblas_set_num_threads"),
)
_found: tuple[Callable[[], int], Callable[[int], None]] | None = None
_looked = False


def _openblas() -> tuple[Callable[[], int], Callable[[int], None]] | None:
    global _found, _looked
    if _looked:
        return _found
    _looked = True
    libraries = Path(np.__file__).resolve().parent.parent / "numpy.libs"
    for path in sorted(libraries.glob("lib*openblas*.so*")):
        try:
            library = ctypes.CDLL(str(path))
        except OSError:
            continue
        for get_name, set_name in _SYMBOLS:
            getter, setter = getattr(library, get_name, None), getattr(library, set_name, None)
            if getter is not None and setter is not None:
                getter.restype = ctypes.c_int
                setter.argtypes = [ctypes.c_int]
                _found = (getter, setter)
                return _found
    return None


@contextlib.contextmanager
def blas_threads(count: int | None) -> Iterator[None]:
    """OpenBLAS limited to ``count`` threads inside the block (``None``: left alone)."""
    found = _openblas() if count is not None else None
    if found is None or count is None:
        yield
        return
    get, set_ = found
    before = get()
    if before == count:
        yield
        return
    set_(count)
    try:
        yield
    finally:
        set_(before)
