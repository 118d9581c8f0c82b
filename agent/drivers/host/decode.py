"""Decode a built package on this CPU with its weights at their stored precision.

The program is the package's own (loaded by :func:`decodebench.formats.coreml.program.load_package`) and
runs in the reference interpreter, except that every ``linear`` over a package constant runs on
:mod:`decodebench.formats.coreml.host_kernels`, whose weights stay int8, packed int4, palettized or fp16 as
stored: the ``constexpr_*`` ops that fed them are never decompressed into a full copy. What is
left to the interpreter (attention over the KV-cache states, norms, the embedding gather) is
the same code the interpreter runs, so the greedy tokens are the interpreter's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from decodebench.formats.coreml.host_kernels import PackedLinear, pack_linear
from decodebench.formats.coreml.inputs import recognise
from decodebench.formats.coreml.interpreter import Interpreter
from decodebench.formats.coreml.program import MilError, load_package
from decodebench.formats.coreml.verify import DecodeSession


class HostInterpreter(Interpreter):
    """The reference interpreter with the package's linear layers on low-bit CPU kernels."""

    def __init__(self, program: Any, function: str = "main", check_finite: bool = True) -> None:
        super().__init__(program, function, check_finite)
        self.linears: dict[int, PackedLinear] = {}
        for op in self._operations:
            if op.op_type == "linear":
                packed = pack_linear(op)
                if packed is not None:
                    self.linears[id(op)] = packed
        # A constexpr op read only by packed linears is never run: its weight stays compressed.
        self._operations = [op for op in self._operations if not self._only_feeds_packed(op)]
        self._last_use = self._last_uses()

    def _only_feeds_packed(self, op: Any) -> bool:
        if not op.op_type.startswith("constexpr_"):
            return False
        consumers = [child for var in op.outputs for child in var.child_ops]
        return bool(consumers) and all(id(child) in self.linears for child in consumers)

    @property
    def weight_bytes_per_step(self) -> int:
        """Bytes of weights the packed linears read per step (each reads its whole weight)."""
        return sum(linear.bytes_read for linear in self.linears.values())

    def kinds(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for linear in self.linears.values():
            counts[linear.kind] = counts.get(linear.kind, 0) + 1
        return counts

    def _execute(
        self, op: Any, env: Mapping[int, Any], states: dict[str, np.ndarray]
    ) -> Sequence[Any]:
        linear = self.linears.get(id(op))
        if linear is None:
            return super()._execute(op, env, states)
        return (linear(np.asarray(self._operand(op.inputs["x"], env), np.float32)),)


class HostEngine:
    """A harness step engine over a package: feed a token, get the greedy next one."""

    def __init__(self, package: Path | str, check_finite: bool = False) -> None:
        loaded = load_package(package)
        self.interpreter = HostInterpreter(loaded.program, check_finite=check_finite)
        self.session = DecodeSession(
            self.interpreter, recognise(self.interpreter, None, str(package))
        )

    def reset(self) -> None:
        self.session.reset()

    def step(self, token: int, position: int) -> int:
        """Ops are not checked one by one (that would be timed too); the logits are."""
        logits = self.session.step(token, position)
        if not np.isfinite(logits).all():
            raise MilError(f"the logits at position {position} are not finite")
        return int(np.argmax(logits))


def greedy_tokens(engine: Any, prompt: Sequence[int], steps: int) -> list[int]:
    """``steps`` greedy tokens after ``prompt`` from any step engine (reset first)."""
    engine.reset()
    token = 0
    for position, prompt_token in enumerate(prompt):
        token = engine.step(prompt_token, position)
    generated = [token]
    for position in range(len(prompt), len(prompt) + steps - 1):
        token = engine.step(token, position)
        generated.append(token)
    return generated
