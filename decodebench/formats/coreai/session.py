"""A decode loop over a Core AI asset on the project's engine: the KV cache kept here (the
program takes it as inputs and returns each call's new K and V, written at the position), the
token, position and mask fed as the build names them."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from decodebench.formats.coreai.engine import Engine, storage_dtype
from decodebench.formats.coreai.program import CoreAIError, Program, load_program

TOKEN, POSITION, MASK, LOGITS = "input_ids", "position", "causal_mask", "logits"
CACHE_PREFIXES = ("key_cache_", "value_cache_")


class HostCacheSession:
    """Decode steps of the ``main`` function, one token at a time."""

    def __init__(self, program: Program, label: str | None = None, function: str = "main") -> None:
        if function not in program.functions:
            raise CoreAIError(f"{program.path}: no function {function!r}")
        self.program = program
        self.label = label or str(program.path)
        self.engine = Engine(program.functions[function], self.label)
        inputs = self.engine.inputs
        missing = [name for name in (TOKEN, POSITION, MASK) if name not in inputs]
        if missing or LOGITS not in self.engine.outputs:
            raise CoreAIError(
                f"{self.label}: not a decode step of this project's interface (missing "
                f"{', '.join(missing + ([] if LOGITS in self.engine.outputs else [LOGITS]))})"
            )
        self.caches = [name for name in inputs if name.startswith(CACHE_PREFIXES)]
        self.returned = {name: name.replace("_cache_", "_") for name in self.caches}
        absent = [out for out in self.returned.values() if out not in self.engine.outputs]
        if absent:
            raise CoreAIError(f"{self.label}: the program does not return {', '.join(absent)}")
        mask = inputs[MASK]
        self.context = int((mask.shape or (0,))[-1])
        self.vocab = int((self.engine.outputs[LOGITS].shape or (0,))[-1])
        self.state: dict[str, np.ndarray] = {}
        self.reset()

    @property
    def has_prefill(self) -> bool:
        return False

    def interface_fields(self) -> dict[str, object]:
        """How this session drives the program, in the fields verify reports for any format."""
        return {
            "token": TOKEN,
            "position": POSITION,
            "mask": MASK,
            "mask_kind": "additive",
            "logits": LOGITS,
            "context": self.context,
            "vocab": self.vocab,
            "states": [],
            "caches": dict(self.returned),
        }

    def reset(self) -> None:
        self.state = {
            name: np.zeros(
                self.engine.inputs[name].shape or (), storage_dtype(self.engine.inputs[name])
            )
            for name in self.caches
        }

    def _mask(self, position: int) -> np.ndarray:
        spec = self.engine.inputs[MASK]
        mask = np.full(spec.shape or (), -np.inf, dtype=np.float32)
        mask[..., :position] = 0.0  # the cache's filled slots; the new token is attended apart
        return mask.astype(storage_dtype(spec))

    def step(self, token: int, position: int) -> np.ndarray:
        """Logits [vocab] (fp32) after ``token`` at ``position``; its K and V are then cached."""
        if not 0 <= position < self.context:
            raise CoreAIError(f"position {position} outside the context of {self.context} tokens")
        if not 0 <= token < self.vocab:
            raise CoreAIError(f"token {token} outside the vocabulary of {self.vocab}")
        feeds = dict(self.state)
        feeds[TOKEN] = np.full(self.engine.inputs[TOKEN].shape or (), token, np.int32)
        feeds[POSITION] = np.full(self.engine.inputs[POSITION].shape or (), position, np.int32)
        feeds[MASK] = self._mask(position)
        outputs = self.engine.run(feeds)
        for cache, returned in self.returned.items():
            self.state[cache][:, :, position : position + 1, :] = outputs[returned]
        return np.asarray(outputs[LOGITS], dtype=np.float32).reshape(-1, self.vocab)[-1]

    def prefill(self, prompt: Sequence[int], start: int = 0) -> np.ndarray:
        rows = [self.step(token, start + offset) for offset, token in enumerate(prompt)]
        return np.stack(rows)

    def next_token(self, token: int, position: int) -> int:
        return int(np.argmax(self.step(token, position)))

    def feeds_at(self, token: int, position: int) -> dict[str, np.ndarray]:
        """The inputs the next :meth:`step` would feed (for holding it to Apple's runtime)."""
        feeds = dict(self.state)
        feeds[TOKEN] = np.full(self.engine.inputs[TOKEN].shape or (), token, np.int32)
        feeds[POSITION] = np.full(self.engine.inputs[POSITION].shape or (), position, np.int32)
        feeds[MASK] = self._mask(position)
        return {name: np.array(value) for name, value in feeds.items()}


def open_session(path: Path | str, label: str | None = None) -> HostCacheSession:
    return HostCacheSession(load_program(path), label)
