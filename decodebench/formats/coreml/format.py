"""Core ML as a :class:`decodebench.formats.seam.ModelFormat`: the calls the rooms above make,
each handed to this folder's own modules (imported on first use: coremltools is heavy)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from decodebench.analysis.graph import ProgramGraph
from decodebench.contracts.names import PACKAGE_NAME
from decodebench.formats.seam import StageRecorder, StepEngine


class CoreML:
    name = "coreml"
    artifact_name = PACKAGE_NAME
    toolchain_packages = ("torch", "coremltools")

    def build_package(
        self,
        functions: dict[str, Any],
        config: Any,
        variant: Any,
        path: Path,
        plan: Any = None,
        stages: StageRecorder | None = None,
    ) -> dict[str, str]:
        from decodebench.formats.coreml.convert import DEFAULT_CONVERTER, Conversion

        conversion = (
            Conversion(config, variant) if stages is None else Conversion(config, variant, stages)
        )
        return DEFAULT_CONVERTER.build_package(functions, conversion, path, plan)

    def read_graph(self, path: Path) -> ProgramGraph:
        from decodebench.formats.coreml.graph import read_program

        return read_program(path)

    def open_engine(self, path: Path, label: str | None = None) -> StepEngine:
        from decodebench.formats.coreml.verify import open_session

        return open_session(path, label=label)

    def hold_to_reference(self, path: Path) -> str | None:
        del path  # Core ML's runtime needs macOS: the MIL interpreter is the reference here
        return None

    def known_faults(self, functions: dict[str, Any]) -> list[str]:
        del functions  # none listed for Core ML: its refusals happen at build time
        return []

    def unpack_upload(
        self, archive: Path, destination: Path, name: str, max_unpacked_bytes: int | None = None
    ) -> Path:
        from decodebench.archives import unpack_package

        return unpack_package(archive, destination, name, max_unpacked_bytes)


FORMAT = CoreML()
__all__: Sequence[str] = ("FORMAT", "CoreML")
