"""The simulated driver's test fixtures: real zip files of an .mlpackage directory laid out as
coremltools saves one, an assignment for them, and one run of the simulated driver."""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path

from agent.drivers.base import Cancellation, run_on_device
from agent.drivers.simulated import SimulatedDevice, SimulatedDriver, TimingParameters
from agent.runner import build_job
from decodebench.contracts.domain import VariantSpec
from decodebench.contracts.protocol import RunAssignment
from decodebench.contracts.results import RunResult

BYTES_PER_TOKEN = 600_000_000
WEIGHTS_BYTES = 200_000
MODEL_ID = "5f0c9d5e-1d7e-4a57-9d0a-2a3c1f8e9b10"
WEIGHTS_ID = "0b8a44a1-5c6f-4f0e-8a51-6c1d2e3f4a5b"


def manifest(items: dict[str, str]) -> str:
    entries = {
        identifier: {"author": "com.apple.CoreML", "name": path.rsplit("/", 1)[-1], "path": path}
        for identifier, path in items.items()
    }
    return json.dumps(
        {"fileFormatVersion": "1.0.0", "itemInfoEntries": entries, "rootModelIdentifier": MODEL_ID}
    )


def write_package(root: Path) -> Path:
    package = root / "decoder.mlpackage"
    (package / "Data" / "com.apple.CoreML" / "weights").mkdir(parents=True)
    (package / "Data" / "com.apple.CoreML" / "model.mlmodel").write_bytes(b"\x08\x09" * 500)
    (package / "Data" / "com.apple.CoreML" / "weights" / "weight.bin").write_bytes(
        bytes(range(256)) * (WEIGHTS_BYTES // 256)
    )
    (package / "Manifest.json").write_text(
        manifest(
            {
                MODEL_ID: "com.apple.CoreML/model.mlmodel",
                WEIGHTS_ID: "com.apple.CoreML/weights",
            }
        )
    )
    return package


def zip_directory(directory: Path, destination: Path, *, keep_top: bool = True) -> Path:
    base = directory.parent if keep_top else directory
    with zipfile.ZipFile(destination, "w", compression=zipfile.ZIP_STORED) as archive:
        for path in sorted(directory.rglob("*")):
            archive.write(path, path.relative_to(base).as_posix())
    return destination


def content_addressed(path: Path) -> Path:
    sha256 = hashlib.sha256(path.read_bytes()).hexdigest()
    return path.rename(path.with_name(f"{sha256}.zip"))


def artifact_of_bytes(directory: Path, data: bytes) -> Path:
    path = directory / "raw.zip"
    path.write_bytes(data)
    return content_addressed(path)


def assignment_for(
    artifact: Path,
    device_class: str = "iphone-17-pro",
    run_id: int = 41,
    prompts: int = 30,
    decode_tokens: int = 32,
    context: int = 512,
) -> RunAssignment:
    return RunAssignment(
        run_id=run_id,
        sweep_id=1,
        build_id=2,
        model="exaone-4.0-1.2b",
        variant=VariantSpec(context=context),
        variant_label=f"folded-ctx{context}",
        device_class=device_class,
        prompts=prompts,
        decode_tokens=decode_tokens,
        artifact_sha256=artifact.stem,
        artifact_url=f"/api/v1/artifacts/{artifact.stem}",
        bytes_per_token=BYTES_PER_TOKEN,
        lease_expires_at="2030-01-01T00:00:00+00:00",
        lease_seconds=300,
    )


def simulate(
    tmp_path: Path,
    artifact: Path,
    device_class: str = "iphone-17-pro",
    udid: str = "sim-test-0",
    run_id: int = 41,
    cancel: Cancellation | None = None,
    time_scale: float = 0.0,
    noise_scale: float = 1.0,
    **assignment_options: int,
) -> RunResult:
    driver = SimulatedDriver(
        [SimulatedDevice(udid, device_class)],
        tmp_path / "work",
        time_scale=time_scale,
        timing=TimingParameters(noise_scale=noise_scale),
    )
    job = build_job(assignment_for(artifact, device_class, run_id, **assignment_options))
    return run_on_device(
        driver, driver.discover()[0], artifact, job, cancel or Cancellation(), timeout_s=60
    )


def aggregate_tok_s(result: RunResult) -> float:
    generated = sum(prompt.generated_tokens for prompt in result.prompts)
    return generated / (sum(sum(p.token_latencies_ms) for p in result.prompts) / 1000)
