"""A decode loop over one program: its KV cache and a step function.

:class:`DecodeSession` drives a program whose KV cache is its Core ML states (with a prefill
function sharing them, if it has one); :class:`Session` is what every decode loop offers, the
one over a cache passed in and out as inputs and outputs
(:class:`decodebench.formats.coreml.cache_io.CacheIoSession`) included.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from decodebench.formats.coreml.inputs import DecodeInterface, step_feed
from decodebench.formats.coreml.interpreter import Interpreter
from decodebench.formats.coreml.program import MilError
from decodebench.formats.seam import StepEngine


class Session(StepEngine, Protocol):
    """A step engine of the seam that also says how it drives its program."""

    interface: DecodeInterface


class DecodeSession:
    """One program's decode loop: a KV cache (the states) and a step function.

    With ``prefill`` (the interpreter of the program's prefill function, sharing the states) the
    prompt goes through it a chunk at a time, as a phone does; what is left over, and a
    decode-only program's whole prompt, is stepped one token at a time.
    """

    def __init__(
        self,
        interpreter: Interpreter,
        interface: DecodeInterface,
        prefill: Interpreter | None = None,
    ) -> None:
        self.interpreter = interpreter
        self.interface = interface
        self.prefill_interpreter = prefill
        self.states = interpreter.new_states()

    @property
    def has_prefill(self) -> bool:
        return self.prefill_interpreter is not None

    def reset(self) -> None:
        self.states = self.interpreter.new_states()

    def step(self, token: int, position: int) -> np.ndarray:
        """Logits [vocab] (fp32) after writing ``token`` at ``position``."""
        feed = step_feed(self.interpreter, self.interface, token, position)
        outputs = self.interpreter.run(feed, self.states)
        logits = np.asarray(outputs[self.interface.logits], dtype=np.float32)
        return logits.reshape(-1, self.interface.vocab)[-1]

    def prefill(self, prompt: Sequence[int], start: int = 0) -> np.ndarray:
        """Logits [len(prompt), vocab] (fp32) of the prompt written from position ``start``."""
        rows: list[np.ndarray] = []
        done = 0
        if self.prefill_interpreter is not None:
            chunk = prefill_chunk(self.prefill_interpreter, self.interface)
            context = self.interface.context
            while len(prompt) - done >= chunk and start + done + chunk <= context:
                tokens = prompt[done : done + chunk]
                feed = chunk_feed(self.prefill_interpreter, self.interface, tokens, start + done)
                outputs = self.prefill_interpreter.run(feed, self.states)
                logits = np.asarray(outputs[self.interface.logits], dtype=np.float32)
                rows.extend(logits.reshape(-1, self.interface.vocab))
                done += chunk
        for token in prompt[done:]:
            rows.append(self.step(token, start + done))
            done += 1
        return np.stack(rows)

    def next_token(self, token: int, position: int) -> int:
        """The greedy token after ``token`` at ``position`` (a harness token source)."""
        return int(np.argmax(self.step(token, position)))


def prefill_chunk(interpreter: Interpreter, interface: DecodeInterface) -> int:
    """The query length of a prefill function: its token input's last axis."""
    return int(interpreter.inputs[interface.token].shape[-1])


def chunk_feed(
    interpreter: Interpreter, interface: DecodeInterface, tokens: Sequence[int], position: int
) -> dict[str, np.ndarray]:
    """The inputs of one prefill chunk: ``tokens`` from ``position`` (its mask is in-graph)."""
    specs = interpreter.inputs
    unknown = set(specs) - {interface.token, interface.position}
    if unknown or interface.position is None:
        raise MilError(f"the prefill function takes inputs it cannot be fed: {sorted(unknown)}")
    for token in tokens:
        if not 0 <= token < interface.vocab:
            raise MilError(f"token {token} outside the vocabulary of {interface.vocab}")
    token_spec, position_spec = specs[interface.token], specs[interface.position]
    return {
        interface.token: np.asarray(tokens, token_spec.dtype).reshape(token_spec.shape),
        interface.position: np.full(position_spec.shape, position, position_spec.dtype),
    }
