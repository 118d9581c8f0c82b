"""Greedy tokens of an emulated Core AI run, from the pushed ``.aimodel`` itself.

The project's Core AI engine (:mod:`decodebench.formats.coreai.engine`, held op by op to
Apple's runtime) runs the very program the agent pushed, through the host-cache decode loop
(:class:`decodebench.formats.coreai.session.HostCacheSession`): the K/V caches are inputs
``key_cache_{i}`` / ``value_cache_{i}`` kept here, each step's outputs ``key_{i}`` /
``value_{i}`` written at its position, the mask showing slots ``0 .. position-1``. So an
emulated Core AI run's token ids are the asset's, as a Core ML run's are its package's
(:mod:`emulator.artifact_tokens`).

An op that makes a non-finite value is an error naming the op (the engine's check); a
non-finite logit is one naming the position, never a silent argmax. An asset whose program does
not match its ``main.hash`` is refused before Core AI reads it: the SDK aborts the whole
process on a damaged program, and the emulated phone lives in the agent's.
"""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

from decodebench.formats.coreai.program import CoreAIError, load_program
from decodebench.formats.coreai.session import HostCacheSession
from decodebench.timing import TokenSource
from emulator.artifact_tokens import ArtifactSessions, greedy


class NonFiniteCoreAILogits(CoreAIError):
    """The asset's decode step returned NaN or infinity as a logit."""


def check_program_hash(package: Path) -> None:
    """CoreAIError unless ``main.mlirb`` is what its ``main.hash`` (its sha256) says."""
    program, digest = package / "main.mlirb", package / "main.hash"
    try:
        expected = digest.read_bytes()
        actual = hashlib.sha256(program.read_bytes()).digest()
    except OSError as error:
        raise CoreAIError(f"{package}: unreadable program or hash: {error}") from None
    if actual != expected:
        raise CoreAIError(f"{package}: main.mlirb does not match its main.hash (a damaged asset)")


class CoreAITokens(TokenSource):
    """The pushed asset itself, decoded on the project's Core AI engine."""

    source = "the pushed .aimodel run by the project's Core AI engine"

    def __init__(self, package: Path) -> None:
        check_program_hash(package)
        self.session = HostCacheSession(load_program(package), str(package))
        self.lock = threading.Lock()

    def reset(self) -> None:
        self.session.reset()

    def step(self, token: int, position: int) -> int:
        return greedy(self.session.step(token, position), position, NonFiniteCoreAILogits, "asset")


COREAI_SESSIONS = ArtifactSessions(CoreAITokens)
