"""What a build worker reports, for the tests and benchmarks that play one over HTTP: a complete
build.json around whatever analysis figures they need, an artifact a simulated agent accepts,
and the builds completed with both."""

from __future__ import annotations

import io
import json
import zipfile
from hashlib import sha256
from typing import Any

import httpx

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
    from decodebench.contracts.presets import get_model

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


def package() -> tuple[bytes, str]:
    """The smallest artifact a simulated device installs (a zipped package with a manifest),
    and its SHA-256."""
    packed = io.BytesIO()
    with zipfile.ZipFile(packed, "w") as archive:
        archive.writestr("model.mlpackage/Manifest.json", json.dumps({"itemInfoEntries": {}}))
    return packed.getvalue(), sha256(packed.getvalue()).hexdigest()


def complete_builds(
    client: httpx.Client,
    builds: list[dict],
    worker_token: str,
    analysis: dict[str, Any] = MINIMAL_ANALYSIS,
) -> None:
    """Act as the worker of ``builds`` (any httpx client, FastAPI's TestClient too): start each
    (one already taken is left alone), upload `package()`, report ``analysis``. Retries a 503."""
    payload, digest = package()
    headers = {"Authorization": f"Bearer {worker_token}"}

    def post(path: str, body: dict) -> httpx.Response:
        for _ in range(10):
            answer = client.post(path, json=body, headers=headers)
            if answer.status_code != 503:
                break
        return answer.raise_for_status()

    for build in builds:
        started = post(f"/api/v1/builds/{build['id']}/start", {"worker": "standin"}).json()
        if not started.get("proceed"):
            continue
        client.put(f"/api/v1/artifacts/{digest}", content=payload, headers=headers)
        report = build_report(build, analysis)
        post(
            f"/api/v1/builds/{build['id']}/complete",
            {"lease": started["lease"], "artifact_sha256": digest, "report": report},
        )


def moving(bytes_per_token: int) -> dict[str, Any]:
    """An analysis whose decode moves ``bytes_per_token`` (what a simulated run is timed by)."""
    return full_analysis({"bytes_per_token": {"total": bytes_per_token}})


def time_scale_for(
    run_seconds: float, device_class: str, prompts: int, decode_tokens: int, bytes_per_token: int
) -> float:
    """The agent's --time-scale at which one such simulated run sleeps about ``run_seconds``."""
    from agent.drivers.simulated import SimulatedDevice, simulate_run, simulated_duration_s
    from agent.runner import build_job
    from decodebench.contracts.domain import VariantSpec
    from decodebench.contracts.protocol import RunAssignment

    assignment = RunAssignment(
        run_id=1, sweep_id=1, build_id=1, model="tiny-gqa",
        variant=VariantSpec.model_validate({"attention": "folded", "context": 512}),
        variant_label="v", device_class=device_class, prompts=prompts,
        decode_tokens=decode_tokens, artifact_sha256="0" * 64, artifact_url="",
        bytes_per_token=bytes_per_token, lease_expires_at="", lease_seconds=120,
    )  # fmt: skip
    device = SimulatedDevice(udid="SIM-PROBE", device_class=device_class)
    result = simulate_run(build_job(assignment), device, package_bytes=200)
    return run_seconds / simulated_duration_s(result)
