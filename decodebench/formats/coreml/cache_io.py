"""Drive a decode step whose KV cache is passed in and out as model inputs and outputs.

The older layout (before Core ML states): each cache is an input, and the step returns it whole,
updated, as an output of the same shape; the caller feeds that output back at the next step.
A cache input is a float input of rank 4 or more with an output of the same shape (paired in
order); the token, position, mask and logits are then recognised among the other inputs and
outputs as for a stateful step (:func:`decodebench.formats.coreml.inputs.recognise`: the dataflow, then
names, or an ``--inputs`` mapping).

:func:`decode_session` gives the session that fits a program: a :class:`DecodeSession` over its
states, or a :class:`CacheIoSession` holding its caches here.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from decodebench.formats.coreml.inputs import InputMapping, recognise, step_feed
from decodebench.formats.coreml.interpreter import Interpreter
from decodebench.formats.coreml.program import MilError
from decodebench.formats.coreml.session import DecodeSession, Session

__all__ = ["CacheIoSession", "Session", "cache_pairs", "decode_session"]


def cache_pairs(interpreter: Interpreter) -> dict[str, str]:
    """cache input name -> the output returning it (empty for a program that has none)."""
    outputs = [spec for spec in interpreter.outputs if spec.dtype.kind == "f"]
    paired: dict[str, str] = {}
    taken: set[str] = set()
    for spec in interpreter.inputs.values():
        if spec.dtype.kind != "f" or len(spec.shape) < 4:
            continue
        match = next((o for o in outputs if o.shape == spec.shape and o.name not in taken), None)
        if match is not None:
            paired[spec.name] = match.name
            taken.add(match.name)
    return paired


class CacheIoSession:
    """A decode loop over a program whose caches are inputs and outputs."""

    has_prefill = False

    def __init__(
        self,
        interpreter: Interpreter,
        program: str = "program",
        mapping: InputMapping | None = None,
    ) -> None:
        self.interpreter = interpreter
        self.caches = cache_pairs(interpreter)
        if not self.caches:
            inputs = ", ".join(
                f"{spec.name} {list(spec.shape)}" for spec in interpreter.inputs.values()
            )
            outputs = ", ".join(f"{spec.name} {list(spec.shape)}" for spec in interpreter.outputs)
            raise MilError(
                f"{program}: neither layout of a KV cache: no states, and no float input of rank "
                f"4 or more returned as an output of its shape (inputs: {inputs}; outputs: "
                f"{outputs})"
            )
        self.interface = recognise(interpreter, mapping, program, self.caches)
        self.values: dict[str, np.ndarray] = {}
        self.reset()

    def reset(self) -> None:
        inputs = self.interpreter.inputs
        self.values = {
            name: np.zeros(inputs[name].shape, inputs[name].dtype) for name in self.caches
        }

    def step(self, token: int, position: int) -> np.ndarray:
        """Logits [vocab] (fp32) after writing ``token`` at ``position``."""
        feed = step_feed(self.interpreter, self.interface, token, position)
        outputs = self.interpreter.run({**feed, **self.values})
        for name, output in self.caches.items():
            self.values[name] = np.asarray(outputs[output]).astype(self.values[name].dtype)
        logits = np.asarray(outputs[self.interface.logits], dtype=np.float32)
        return logits.reshape(-1, self.interface.vocab)[-1]

    def prefill(self, prompt: Sequence[int], start: int = 0) -> np.ndarray:
        """Logits [len(prompt), vocab] (fp32), the prompt stepped one token at a time."""
        return np.stack([self.step(token, start + i) for i, token in enumerate(prompt)])

    def next_token(self, token: int, position: int) -> int:
        return int(np.argmax(self.step(token, position)))


def decode_session(
    interpreter: Interpreter,
    program: str = "program",
    mapping: InputMapping | None = None,
    prefill: Interpreter | None = None,
) -> Session:
    """The decode loop of ``interpreter``'s program: over its states (with ``prefill``, the
    program's prefill function sharing them, if given), or over cache I/O."""
    if interpreter.states:
        return DecodeSession(interpreter, recognise(interpreter, mapping, program), prefill)
    return CacheIoSession(interpreter, program, mapping)
