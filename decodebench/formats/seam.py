"""What a model format implements, in types no format's SDK defines.

A format turns a decoder (:class:`decodebench.modeling.DecodeStepModel`) into a package on
disk, reads a package into the neutral graph the analyses consume
(:class:`decodebench.analysis.graph.ProgramGraph`), decodes a package step by step with its
reference engine (verify, the build's finite check, the emulated phone), and says which
uploaded archives are its packages. Everything behind these calls, the SDK included, lives in
the format's own folder; ``decodebench.formats.get_format`` finds it by name.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from decodebench.analysis.graph import ProgramGraph


class NonFiniteValue(ValueError):
    """An op of a format's engine produced NaN, or an infinity none of its inputs held (an fp16
    overflow); ``op_name`` and ``op_type`` name it, ``function`` the program's function."""

    def __init__(
        self, message: str, op_name: str, op_type: str, function: str | None = None
    ) -> None:
        super().__init__(message)
        self.op_name = op_name
        self.op_type = op_type
        self.function = function


class ReferenceDisagreement(ValueError):
    """A format's engine and its trusted runtime computed different values; the message names
    the op."""


class StageRecorder(Protocol):
    """Receives the named stages of a conversion (for timings and progress)."""

    def stage(self, name: str) -> contextlib.AbstractContextManager[None]: ...


class StepEngine(Protocol):
    """A decode loop over one package: logits for a token at a position, the cache kept
    inside. ``reset`` empties the cache for the next prompt."""

    @property
    def has_prefill(self) -> bool: ...

    def reset(self) -> None: ...

    def step(self, token: int, position: int) -> np.ndarray: ...

    def prefill(self, prompt: Sequence[int], start: int = 0) -> np.ndarray: ...

    def next_token(self, token: int, position: int) -> int: ...


class ModelFormat(Protocol):
    """One model format. ``name`` is what a variant and an uploaded model say (``coreml``);
    ``artifact_name`` the package's file name inside a build; ``toolchain_packages`` the
    distributions whose releases key its builds."""

    name: str
    artifact_name: str
    toolchain_packages: tuple[str, ...]

    def build_package(
        self,
        functions: dict[str, Any],
        config: Any,
        variant: Any,
        path: Path,
        plan: Any = None,
        stages: StageRecorder | None = None,
    ) -> dict[str, str]:
        """Convert the decoders in ``functions`` (name -> DecodeStepModel, consumed) for
        ``config`` and ``variant`` straight into the package at ``path``, quantized by
        ``plan``; {weight: the compression op that now holds it}."""
        ...

    def read_graph(self, path: Path) -> ProgramGraph:
        """The package at ``path`` as the neutral graph; AnalysisError naming what is wrong."""
        ...

    def open_engine(self, path: Path, label: str | None = None) -> StepEngine:
        """The reference decode loop of the package at ``path``."""
        ...

    def hold_to_reference(self, path: Path) -> str | None:
        """Hold the built package's decode to the format's own trusted runtime where one runs
        here; a line saying how it agreed (or why it was not held), None where no runtime
        exists. A disagreement raises ReferenceDisagreement naming the op."""
        ...

    def known_faults(self, functions: dict[str, Any]) -> list[str]:
        """Warnings for the faults the format's runtime is known to have on phones, each naming
        the op of ``functions`` (the package's graphs) that would meet it."""
        ...

    def unpack_upload(
        self, archive: Path, destination: Path, name: str, max_unpacked_bytes: int | None = None
    ) -> Path:
        """Check and unpack an uploaded archive of one package into ``destination``; the
        package's path. ValueError naming what is wrong (unsafe entries, no package, several)."""
        ...
