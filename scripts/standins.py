"""What a build worker reports, for the tests and benchmarks that play one over HTTP: a complete
build.json around whatever analysis figures they need."""

from __future__ import annotations

from typing import Any

MINIMAL_ANALYSIS: dict[str, Any] = {
    "functions": ["main"], "decode_function": "main", "ops_total": 1, "non_const_ops": 1,
    "dispatch_ops": 1, "op_counts": {}, "tile_ops": 0, "tile_output_bytes": 0, "tiles": [],
    "slice_update_ops": 0, "state_write_ops": 0, "state_read_ops": 0, "weight_bytes": 1,
    "weight_file_bytes": 1, "state_bytes": 0, "states": [],
    "bytes_per_token": {"weights": 0, "kv_read": 0, "kv_write": 0, "redundant": 0, "total": 1},
}  # fmt: skip


def full_analysis(figures: dict[str, Any]) -> dict[str, Any]:
    """A complete analysis document carrying the figures a caller cares about."""
    moved = {**MINIMAL_ANALYSIS["bytes_per_token"], **figures.get("bytes_per_token", {})}
    return {**MINIMAL_ANALYSIS, **figures, "bytes_per_token": moved}


def build_report(build: dict[str, Any], analysis: dict[str, Any]) -> dict[str, Any]:
    """A build.json for ``build`` (as the API shows it) as a worker would write it."""
    from decodebench.presets import get_model

    return {
        "key": build["key"],
        "model": build["model"],
        "variant": build["variant"],
        "config": get_model(build["model"]).model_dump(mode="json"),
        "toolchain": build["toolchain"],
        "stage_seconds": {"convert": 0.1},
        "peak_rss_bytes": 1,
        "package": "model.mlpackage",
        "analysis": analysis,
    }
