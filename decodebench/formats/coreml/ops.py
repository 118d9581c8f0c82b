"""NumPy kernels of the MIL ops the reference interpreter runs, written from the MIL op spec.

``KERNELS`` maps an op type to its kernel (see :mod:`decodebench.formats.coreml.registry`); importing this
module registers every kernel module. State ops (``read_state``, ``coreml_update_state``,
``write_state``) live in the interpreter, which owns the state storage.
"""

from __future__ import annotations

from decodebench.formats.coreml import ops_constexpr, ops_math, ops_tensor
from decodebench.formats.coreml.registry import KERNELS, Kernel, OpArgs, kernel

__all__ = ["KERNELS", "Kernel", "OpArgs", "kernel", "ops_constexpr", "ops_math", "ops_tensor"]
