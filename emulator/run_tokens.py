"""Where an emulated run's greedy tokens come from: the device's ``tokens`` setting (see
``emulator.device.TOKEN_SOURCES``) and the job's engine.

``mil`` decodes the pushed package itself on its format's reference engine: a Core ML
``.mlpackage`` in the MIL interpreter (:mod:`emulator.artifact_tokens`), a Core AI ``.aimodel``
on the project's Core AI engine (:mod:`emulator.coreai_tokens`); ``auto`` does too for packages
up to ``MIL_AUTO_MAX_BYTES`` and runs without token ids when the engine cannot load the program;
``torch`` rebuilds the model from its preset; ``off`` gives none.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from decodebench.archives import AIMODEL_PROGRAM, MANIFEST
from decodebench.formats.coreai.program import CoreAIError
from decodebench.formats.coreml.program import MilError
from decodebench.harness import COMPLETE_MARKER, HarnessJob
from decodebench.timing import TokenSource
from emulator.artifact_tokens import MIL_AUTO_MAX_BYTES, MIL_SESSIONS, ArtifactSessions
from emulator.coreai_tokens import COREAI_SESSIONS
from emulator.reference import ReferenceCache

if TYPE_CHECKING:
    from emulator.device import EmulatedDevice

# A model a job's package cannot be decoded with: the run fails as a model error.
ARTIFACT_ERRORS = (MilError, CoreAIError)
ENGINE_SESSIONS: dict[str, ArtifactSessions] = {"coreml": MIL_SESSIONS, "coreai": COREAI_SESSIONS}
ENGINE_READERS = {"coreml": "the MIL interpreter", "coreai": "the Core AI engine"}
# The file a pushed package of each engine cannot be without (beside the push's marker).
PACKAGE_ANCHORS = {"coreml": MANIFEST, "coreai": AIMODEL_PROGRAM}
REFERENCES = ReferenceCache()


def package_ready(package: Path, engine: str) -> bool:
    """The push finished (its marker) and the package is one of the job's engine."""
    anchor = PACKAGE_ANCHORS.get(engine)
    return (
        anchor is not None
        and (package.parent / COMPLETE_MARKER).exists()
        and (package / anchor).is_file()
    )


def token_source(
    device: EmulatedDevice,
    job: HarnessJob,
    package: Path,
    package_bytes: int,
    say: Callable[[str], None] | None = None,
) -> TokenSource | None:
    """Greedy tokens for this run (see the module); ARTIFACT_ERRORS when ``mil`` was asked for
    and the package cannot be decoded."""
    sessions = ENGINE_SESSIONS[job.engine]
    if device.tokens == "mil":
        return sessions.get(package)
    if device.tokens == "auto" and package_bytes <= MIL_AUTO_MAX_BYTES:
        try:
            return sessions.get(package)
        except ARTIFACT_ERRORS as error:
            if say is not None:
                reader = ENGINE_READERS[job.engine]
                say(f"run {job.run_id}: no token ids: {reader} cannot run it: {error}")
            return None
    if device.tokens == "torch" and job.variant is not None:
        return REFERENCES.get(job.model, job.variant)
    return None
