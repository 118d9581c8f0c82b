"""Building one variant for the server: the leased-work loop (worker/leased.py) with the
build's handler: have the library build the assignment
(:func:`decodebench.building.assignment.build_assignment`), upload the package, report."""

from __future__ import annotations

from decodebench.artifacts import pack_directory
from decodebench.client import DecodebenchClient, LeasedWork
from decodebench.contracts.workers import BuildAssignment, BuildOutcome
from decodebench.toolchain import ToolchainMismatch, check_toolchain
from worker.config import WorkerSettings
from worker.leased import Held, LeasedKind, Refused, delivered, run_leased


def build(held: Held[BuildAssignment]) -> tuple[BuildOutcome, str]:
    """The build's package uploaded, and its report; Refused for another toolchain's build."""
    from decodebench.building.assignment import build_assignment
    from decodebench.building.build import toolchain_versions

    try:
        # A Core AI build is keyed by Core AI's packages, not coremltools.
        installed = toolchain_versions(None, held.assignment.variant.format)
        check_toolchain(held.assignment.toolchain, installed)
    except ToolchainMismatch as error:
        raise Refused(str(error)) from None
    out_dir = held.tmp / "out"
    work_dir = held.settings.work_dir
    report = build_assignment(held.client, held.assignment, work_dir, out_dir, held.progress)
    held.progress("upload", 1.0)
    archive = pack_directory(out_dir, held.tmp / "artifact.zip")
    sha256 = delivered(
        lambda: held.client.upload_artifact(archive),
        held.settings,
        f"build {held.work_id} package",
    )
    return BuildOutcome(lease=held.lease, artifact_sha256=sha256, report=report), f"built {sha256}"


def _builds(client: DecodebenchClient) -> LeasedWork[BuildAssignment]:
    return client.builds


BUILDS = LeasedKind(noun="build", calls=_builds, handle=build)


def run_build(build_id: int, settings: WorkerSettings) -> str:
    """Returns what happened, for the task's result and the log."""
    return run_leased(BUILDS, build_id, settings)
