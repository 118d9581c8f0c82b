"""How a build is shown in API responses and pages."""

from __future__ import annotations

from typing import Any

from decodebench.profiles import DEVICE_PROFILES
from server.models import Build

MIB = 1024 * 1024


def analysis_summary(build: Build) -> dict[str, Any] | None:
    if not build.report or "analysis" not in build.report:
        return None
    analysis = build.report["analysis"]
    bytes_per_token = int(analysis["bytes_per_token"]["total"])
    return {
        "ops_total": analysis["ops_total"],
        "tile_ops": analysis["tile_ops"],
        "tile_output_bytes": analysis["tile_output_bytes"],
        "tile_output_mib": analysis["tile_output_bytes"] / MIB,
        "state_write_ops": analysis["state_write_ops"],
        "weight_bytes": analysis["weight_bytes"],
        "bytes_per_token": analysis["bytes_per_token"],
        "predicted_tok_s": {
            device_class: profile.predicted_tok_s(bytes_per_token)
            for device_class, profile in DEVICE_PROFILES.items()
        },
    }


def build_view(build: Build, *, detail: bool = False) -> dict[str, Any]:
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
        "analysis": analysis_summary(build),
    }
    if detail:
        view["report"] = build.report
    return view
