"""Drive a decode step whose KV cache is passed in and out as model inputs and outputs.

The older layout (before Core ML states): each cache is an input, and the step returns it whole,
updated, as an output of the same shape; the caller feeds that output back at the next step.
A cache input is a float input of rank 4 or more with an output of the same shape (paired in
order); the token, position and mask are recognised from the dataflow as for a stateful step
(:mod:`decodebench.mil.roles`), then by name.

:func:`decode_session` gives the session that fits a program: a :class:`DecodeSession` over its
states, or a :class:`CacheIoSession` holding its caches here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from decodebench.mil.inputs import (
    MASK_NAME,
    POSITION_NAME,
    TOKEN_NAME,
    DecodeInterface,
    recognise,
    step_feed,
)
from decodebench.mil.interpreter import Interpreter, TensorSpec
from decodebench.mil.program import MilError
from decodebench.mil.roles import infer_roles
from decodebench.mil.verify import DecodeSession


class Session(Protocol):
    interface: DecodeInterface

    def reset(self) -> None: ...

    def step(self, token: int, position: int) -> np.ndarray: ...

    def prefill(self, prompt: Sequence[int], start: int = 0) -> np.ndarray: ...

    def next_token(self, token: int, position: int) -> int: ...


def _caches(interpreter: Interpreter) -> dict[str, str]:
    """cache input name -> the output returning it."""
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


def _one(specs: list[TensorSpec], pattern: object, role: str, program: str) -> TensorSpec | None:
    if len(specs) <= 1:
        return specs[0] if specs else None
    named = [spec for spec in specs if pattern.search(spec.name)]  # type: ignore[attr-defined]
    if len(named) == 1:
        return named[0]
    raise MilError(f"{program}: cannot tell which input is the {role}")


class CacheIoSession:
    """A decode loop over a program whose caches are inputs and outputs."""

    has_prefill = False

    def __init__(self, interpreter: Interpreter, program: str = "program") -> None:
        self.interpreter = interpreter
        self.caches = _caches(interpreter)
        if not self.caches:
            raise MilError(
                f"{program}: neither states nor cache inputs returned as outputs of the same shape"
            )
        contexts = {interpreter.inputs[name].shape[-2] for name in self.caches}
        if len(contexts) != 1:
            raise MilError(f"{program}: cache inputs disagree on the context: {sorted(contexts)}")
        context = contexts.pop()
        others = [o for o in interpreter.outputs if o.name not in self.caches.values()]
        floats = [o for o in others if o.dtype.kind == "f" and o.shape]
        if not floats:
            raise MilError(f"{program}: no floating-point output to read logits from")
        logits = max(floats, key=lambda spec: spec.shape[-1])
        evidence = infer_roles(interpreter.function, logits.shape[-1], context)
        rest = [spec for spec in interpreter.inputs.values() if spec.name not in self.caches]

        def shown(role: str) -> list[TensorSpec]:
            return [s for s in rest if getattr(evidence.get(s.name), role, None)]

        ints = [s for s in rest if s.dtype.kind in "iu" and int(np.prod(s.shape)) == 1]
        token = _one(shown("token") or ints, TOKEN_NAME, "token", program)
        if token is None:
            raise MilError(f"{program}: no input looks like a token id")
        rest = [s for s in rest if s.name != token.name]
        ints = [s for s in ints if s.name != token.name]
        position = _one(
            [s for s in shown("position") if s.name != token.name] or ints,
            POSITION_NAME,
            "position",
            program,
        )
        rest = [s for s in rest if position is None or s.name != position.name]
        masks = [s for s in rest if s.shape and s.shape[-1] == context]
        mask = _one(masks, MASK_NAME, "causal mask", program)
        self.interface = DecodeInterface(
            token=token.name,
            position=None if position is None else position.name,
            mask=None if mask is None else mask.name,
            mask_kind="binary" if mask is not None and mask.dtype.kind in "biu" else "additive",
            logits=logits.name,
            context=context,
            vocab=logits.shape[-1],
            states=[],
        )
        self.values: dict[str, np.ndarray] = {}
        self.reset()

    def reset(self) -> None:
        inputs = self.interpreter.inputs
        self.values = {
            name: np.zeros(inputs[name].shape, inputs[name].dtype) for name in self.caches
        }

    def step(self, token: int, position: int) -> np.ndarray:
        feed = step_feed(self.interpreter, self.interface, token, position)
        outputs = self.interpreter.run({**feed, **self.values})
        for name, output in self.caches.items():
            self.values[name] = np.asarray(outputs[output]).astype(self.values[name].dtype)
        logits = np.asarray(outputs[self.interface.logits], dtype=np.float32)
        return logits.reshape(-1, self.interface.vocab)[-1]

    def prefill(self, prompt: Sequence[int], start: int = 0) -> np.ndarray:
        return np.stack([self.step(token, start + i) for i, token in enumerate(prompt)])

    def next_token(self, token: int, position: int) -> int:
        return int(np.argmax(self.step(token, position)))


def decode_session(interpreter: Interpreter, program: str = "program") -> Session:
    """The decode loop of ``interpreter``'s program: over its states, or over cache I/O."""
    if interpreter.states:
        return DecodeSession(interpreter, recognise(interpreter, program=program))
    return CacheIoSession(interpreter, program)
