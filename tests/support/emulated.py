"""Runs of the emulated driver on emulated iPhones: a real tiny-gqa build, its assignment, one
run checked as the agent checks it, and waiting for the fleet to change."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from agent.drivers.base import Cancellation, run_on_device
from agent.drivers.emulated import EmulatedDriver
from agent.runner import build_job, check_result
from decodebench.contracts.domain import VariantSpec
from decodebench.contracts.protocol import DeviceInfo, RunAssignment
from decodebench.contracts.results import RunResult

CONTEXT = 128


@dataclass(frozen=True)
class Build:
    variant: VariantSpec
    artifact: Path
    package: Path
    bytes_per_token: int


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.02)


class Built(Protocol):
    """What an assignment reads of a build (any test's record of one)."""

    variant: VariantSpec
    artifact: Path
    bytes_per_token: int


def assignment(
    build: Built, device: DeviceInfo, run_id: int = 11, prompts: int = 3, tokens: int = 4
) -> RunAssignment:
    return RunAssignment(
        run_id=run_id,
        sweep_id=1,
        build_id=1,
        model="tiny-gqa",
        variant=build.variant,
        variant_label=build.variant.label,
        device_class=device.device_class,
        prompts=prompts,
        decode_tokens=tokens,
        artifact_sha256=build.artifact.stem,
        artifact_url="",
        bytes_per_token=build.bytes_per_token,
        lease_expires_at="2030-01-01T00:00:00+00:00",
        lease_seconds=120,
    )


def run(
    driver: EmulatedDriver, device: DeviceInfo, build: Build, timeout_s: float = 60, **kwargs: int
) -> RunResult:
    job = build_job(assignment(build, device, **kwargs), device)
    result = run_on_device(driver, device, build.artifact, job, Cancellation(), timeout_s=timeout_s)
    check_result(job, device, result)
    return result


def files_of(directory: Path) -> dict[str, bytes]:
    return {
        path.relative_to(directory).as_posix(): path.read_bytes()
        for path in sorted(directory.rglob("*"))
        if path.is_file()
    }
