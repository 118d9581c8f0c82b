"""Greedy tokens of an emulated run, from the pushed ``.mlpackage`` itself.

The MIL reference interpreter (``decodebench.formats.coreml``) runs the very program the agent pushed, so
an emulated run's token ids are the artifact's, not those of a model rebuilt from its preset.
Both KV layouts the builder makes are driven:

- ``kv="state"``: the cache is the program's states (``decodebench.formats.coreml.verify.DecodeSession``);
- ``kv="input"``: the cache arrays are held here and passed as inputs ``key_cache_{i}`` /
  ``value_cache_{i}``; each step's outputs ``key_{i}`` / ``value_{i}`` are written at its
  position, as ``agent/drivers/host/driver.py`` and the Swift harness do, and the mask shows slots
  ``0 .. position-1`` (the new token is attended inside the graph; ``decodebench.modeling``).

A non-finite logit is an error naming the step, never a silent argmax.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np

from decodebench.formats.coreml.inputs import recognise
from decodebench.formats.coreml.interpreter import Interpreter
from decodebench.formats.coreml.program import MilError, load_package
from decodebench.formats.coreml.verify import DecodeSession
from decodebench.timing import TokenSource

# "auto" decodes packages up to this size (tiny-gqa, 7 MiB, takes about 0.2 s a step in the MIL
# interpreter on a 2-core host); larger ones run without token ids rather than for hours. The
# same limit holds for Core AI assets on the project's engine.
MIL_AUTO_MAX_BYTES = 32 * 2**20
CACHE_INPUT = re.compile(r"^(key|value)_cache_(\d+)$")


class NonFiniteLogits(MilError):
    """The program produced NaN or infinity where a logit should be."""


def greedy(
    logits: np.ndarray,
    position: int,
    error: type[Exception] = NonFiniteLogits,
    producer: str = "model",
) -> int:
    """The greedy token, or ``error`` naming the first non-finite logit and its position."""
    finite = np.isfinite(logits)
    if not finite.all():
        index = int(np.argmin(finite))
        raise error(
            f"logit {index} at position {position} is {logits[index]}: the {producer} produced a "
            "non-finite value"
        )
    return int(np.argmax(logits))


class HostKVSession:
    """A ``kv="input"`` decode step: the cache arrays live here, the program only reads them."""

    def __init__(self, interpreter: Interpreter, label: str) -> None:
        self.interpreter = interpreter
        inputs = interpreter.inputs
        outputs = {spec.name for spec in interpreter.outputs}
        caches = sorted(
            (int(match.group(2)), match.group(1), name)
            for name in inputs
            if (match := CACHE_INPUT.match(name))
        )
        needed = {"input_ids", "position", "causal_mask"} - set(inputs)
        if not caches or needed or "logits" not in outputs:
            raise MilError(
                f"{label}: a program without states must take input_ids, position, causal_mask "
                "and key_cache_i/value_cache_i and return logits (a kv=input build); "
                f"its inputs are {', '.join(inputs)}"
            )
        self.pairs = [(name, f"{kind}_{layer}") for layer, kind, name in caches]
        missing = [new for _, new in self.pairs if new not in outputs]
        if missing:
            raise MilError(f"{label}: no output {missing[0]} for its cache input")
        self.context = inputs[self.pairs[0][0]].shape[2]
        self.vocab = next(spec for spec in interpreter.outputs if spec.name == "logits").shape[-1]
        self.caches: dict[str, np.ndarray] = {}
        self.reset()

    def reset(self) -> None:
        specs = self.interpreter.inputs
        self.caches = {
            name: np.zeros(specs[name].shape, specs[name].dtype) for name, _ in self.pairs
        }

    def step(self, token: int, position: int) -> np.ndarray:
        if not 0 <= position < self.context:
            raise MilError(f"position {position} outside the context of {self.context}")
        specs = self.interpreter.inputs
        mask = specs["causal_mask"]
        visible = np.arange(self.context) < position  # this token is attended in the graph
        feed = {
            "input_ids": np.full(specs["input_ids"].shape, token, specs["input_ids"].dtype),
            "position": np.full(specs["position"].shape, position, specs["position"].dtype),
            "causal_mask": np.broadcast_to(np.where(visible, 0.0, -np.inf), mask.shape).astype(
                mask.dtype
            ),
            **self.caches,
        }
        outputs = self.interpreter.run(feed, {})
        for cache, new in self.pairs:
            self.caches[cache][:, :, position : position + 1, :] = outputs[new]
        return np.asarray(outputs["logits"], dtype=np.float32).reshape(-1)[-self.vocab :]


class MilTokens(TokenSource):
    """The pushed package itself, run by the MIL reference interpreter (decodebench.formats.coreml)."""

    source = "the pushed package run by the MIL reference interpreter"

    def __init__(self, package: Path) -> None:
        interpreter = Interpreter(load_package(package).program)
        self.kv = "state" if interpreter.states else "input"
        self.session: DecodeSession | HostKVSession
        if self.kv == "state":
            self.session = DecodeSession(interpreter, recognise(interpreter, None, str(package)))
        else:
            self.session = HostKVSession(interpreter, str(package))
        self.lock = threading.Lock()

    def reset(self) -> None:
        self.session.reset()

    def step(self, token: int, position: int) -> int:
        return greedy(self.session.step(token, position), position)


class ArtifactSessions:
    """One decode session per package path (loading one parses the whole program), made by
    ``factory``: the MIL interpreter's for Core ML packages, the Core AI engine's for assets."""

    def __init__(
        self, factory: Callable[[Path], TokenSource] = MilTokens, capacity: int = 2
    ) -> None:
        self._factory = factory
        self._capacity = capacity
        self._sessions: dict[Path, TokenSource] = {}
        self._lock = threading.Lock()

    def get(self, package: Path) -> TokenSource:
        with self._lock:
            session = self._sessions.pop(package, None) or self._factory(package)
            self._sessions[package] = session
            while len(self._sessions) > self._capacity:
                self._sessions.pop(next(iter(self._sessions)))
            return session


MIL_SESSIONS = ArtifactSessions(MilTokens)
