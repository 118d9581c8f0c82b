"""Core AI as a :class:`decodebench.formats.seam.ModelFormat` (the SDK imported on first use)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from decodebench.analysis.graph import ProgramGraph
from decodebench.contracts.names import ARTIFACT_NAMES, FormatName
from decodebench.formats.seam import StageRecorder, StepEngine


class CoreAI:
    name = "coreai"
    artifact_name = ARTIFACT_NAMES[FormatName.coreai]
    toolchain_packages = ("torch", "coreai-core", "coreai-torch", "coreai-opt")

    def build_package(
        self,
        functions: dict[str, Any],
        config: Any,
        variant: Any,
        path: Path,
        plan: Any = None,
        stages: StageRecorder | None = None,
    ) -> dict[str, str]:
        from decodebench.formats.coreai.convert import build_asset

        # The recipe is the variant's ``quant``: coreai-opt applies it to the converted program
        # (decodebench.formats.coreai.quantize), refusing by name what it cannot apply.
        del plan
        return build_asset(functions, config, variant, path, stages)

    def read_graph(self, path: Path) -> ProgramGraph:
        from decodebench.formats.coreai.graph import read_asset

        return read_asset(path)

    def open_engine(self, path: Path, label: str | None = None) -> StepEngine:
        from decodebench.formats.coreai.session import open_session

        return open_session(path, label)

    def hold_to_reference(self, path: Path) -> str | None:
        from decodebench.formats.coreai.check import hold_build

        return hold_build(path)

    def known_faults(self, functions: dict[str, Any]) -> list[str]:
        from decodebench.formats.coreai.faults import known_faults

        return known_faults(functions)

    def unpack_upload(
        self, archive: Path, destination: Path, name: str, max_unpacked_bytes: int | None = None
    ) -> Path:
        raise ValueError(
            f"{name}: uploaded Core AI assets are not accepted yet; build the model from its "
            "checkpoint with format coreai instead"
        )


FORMAT = CoreAI()
