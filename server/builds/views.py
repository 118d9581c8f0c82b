"""How a build is shown in API responses and pages."""

from __future__ import annotations

from collections.abc import Mapping

from sqlalchemy.orm import object_session

from decodebench.contracts.api import AnalysisSummary, BuildDetail, BuildView
from decodebench.contracts.domain import VariantSpec
from decodebench.contracts.names import BuildState
from decodebench.contracts.profiles import DEVICE_PROFILES, DeviceProfile
from server.build_reports import readable_report
from server.models import Build
from server.profiles.service import current_profiles

MIB = 1024 * 1024


def _profiles_for(build: Build) -> Mapping[str, DeviceProfile]:
    session = object_session(build)
    return current_profiles(session) if session is not None else DEVICE_PROFILES


def analysis_summary(
    build: Build, profiles: Mapping[str, DeviceProfile] | None = None
) -> AnalysisSummary | None:
    """The headline figures of a build's analysis; predictions use the current profiles."""
    report, _ = readable_report(build)
    if report is None:
        return None
    analysis = report.analysis
    chosen = _profiles_for(build) if profiles is None else profiles
    return AnalysisSummary(
        ops_total=analysis.ops_total,
        dispatch_ops=analysis.dispatch_ops,
        tile_ops=analysis.tile_ops,
        tile_output_bytes=analysis.tile_output_bytes,
        tile_output_mib=analysis.tile_output_bytes / MIB,
        redundant_ops=len(analysis.redundant_ops),
        redundant_output_bytes=analysis.redundant_output_bytes,
        state_write_ops=analysis.state_write_ops,
        weight_bytes=analysis.weight_bytes,
        bytes_per_token=analysis.bytes_per_token,
        predicted_tok_s=analysis.predicted_tok_s(chosen.values()),
    )


def build_label(build: Build) -> str:
    return f"build {build.id}: {build.model} {VariantSpec.model_validate(build.variant).label}"


def build_view(
    build: Build, *, label: str | None = None, profiles: Mapping[str, DeviceProfile] | None = None
) -> BuildView:
    variant = VariantSpec.model_validate(build.variant)
    _, unreadable = readable_report(build)
    return BuildView(
        id=build.id,
        key=build.key,
        model=build.model,
        variant=variant,
        label=label or variant.label,
        toolchain=build.toolchain,
        state=BuildState(build.state),
        stage=build.stage,
        progress=build.progress,
        attempts=build.attempts,
        error=build.error or unreadable,
        artifact_sha256=build.artifact_sha256,
        analysis=analysis_summary(build, profiles),
    )


def build_detail(build: Build) -> BuildDetail:
    return BuildDetail(**build_view(build).model_dump(), report=readable_report(build)[0])
