"""How a build is shown in API responses and pages."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError
from sqlalchemy.orm import object_session

from decodebench.analysis import predictions_from_report
from decodebench.domain import VariantSpec
from decodebench.profiles import DEVICE_PROFILES, DeviceProfile
from server.models import Build
from server.profiles.service import current_profiles

MIB = 1024 * 1024


def _profiles_for(build: Build) -> Mapping[str, DeviceProfile]:
    session = object_session(build)
    return current_profiles(session) if session is not None else DEVICE_PROFILES


def analysis_summary(
    build: Build, profiles: Mapping[str, DeviceProfile] | None = None
) -> dict[str, Any] | None:
    """The headline figures of a build's analysis; predictions use the current profiles."""
    if not build.report or "analysis" not in build.report:
        return None
    analysis = build.report["analysis"]
    chosen = _profiles_for(build) if profiles is None else profiles
    return {
        "ops_total": analysis["ops_total"],
        "dispatch_ops": analysis.get("dispatch_ops", analysis.get("non_const_ops")),
        "tile_ops": analysis["tile_ops"],
        "tile_output_bytes": analysis["tile_output_bytes"],
        "tile_output_mib": analysis["tile_output_bytes"] / MIB,
        "redundant_ops": len(analysis.get("redundant_ops", analysis.get("tiles", []))),
        "redundant_output_bytes": analysis.get(
            "redundant_output_bytes", analysis["tile_output_bytes"]
        ),
        "state_write_ops": analysis["state_write_ops"],
        "weight_bytes": analysis["weight_bytes"],
        "bytes_per_token": analysis["bytes_per_token"],
        "predicted_tok_s": predictions_from_report(analysis, chosen.values()),
    }


def build_label(build: Build) -> str:
    try:
        label = VariantSpec.model_validate(build.variant).label
    except ValidationError:  # a variant stored by another version of the domain types
        label = json.dumps(build.variant, sort_keys=True)
    return f"build {build.id}: {build.model} {label}"


def build_view(
    build: Build, *, detail: bool = False, profiles: Mapping[str, DeviceProfile] | None = None
) -> dict[str, Any]:
    view: dict[str, Any] = {
        "id": build.id,
        "key": build.key,
        "model": build.model,
        "variant": build.variant,
        "toolchain": build.toolchain,
        "state": build.state,
        "stage": build.stage,
        "progress": build.progress,
        "attempts": build.attempts,
        "error": build.error,
        "artifact_sha256": build.artifact_sha256,
        "analysis": analysis_summary(build, profiles),
    }
    if detail:
        view["report"] = build.report
    return view
