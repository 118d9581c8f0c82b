"""The host as a device: the build's PyTorch reference decoder on this CPU, timed for real.

Not an iPhone and not Core ML: the same preset, seeded weights and attention layout as the
build (`decodebench.modeling`, fp32), stepped through the same decode sweep protocol as the iOS
harness (`decodebench.harness`), with wall-clock timings. Results say `driver="host"`,
`simulated=False`, and their `timing_model` names the CPU, the threads and the dtype.

- load: cold = building the model (allocating and initialising its weights) the first time,
  warm = building it again once the first copy is dropped;
- peak memory: the bytes of the model's parameters and buffers (weights and KV cache);
- thermal state: unknown (not measured on a host).
"""

from __future__ import annotations

import gc
import json
import logging
import os
import platform
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.drivers.base import Cancellation, DriverError, HarnessJob, InstalledModel
from decodebench.contracts.names import REPORT_NAME, Driver
from decodebench.contracts.protocol import DeviceInfo, PromptResult, RunResult, ThermalState
from decodebench.emulated.reference import TorchStepEngine, resolve_config
from decodebench.harness import MonotonicClock, run_prompt, warm_up

log = logging.getLogger(__name__)

DRIVER_NAME = Driver.host
BUILD_REPORT = REPORT_NAME


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def model_bytes(engine: TorchStepEngine) -> int:
    tensors = [*engine.model.parameters(), *engine.model.buffers()]
    return sum(tensor.numel() * tensor.element_size() for tensor in tensors)


@dataclass
class _Run:
    job: HarnessJob
    installed: InstalledModel
    result: RunResult | None = None


class HostDriver:
    name = DRIVER_NAME

    def __init__(
        self, work_dir: Path, device_class: str, udid: str, threads: int | None = None
    ) -> None:
        self.work_dir = work_dir
        self.threads = threads
        self.device = DeviceInfo(
            udid=udid[:128],
            device_class=device_class,
            product_type=f"host-{platform.machine()}"[:64],
            os_version=platform.release()[:32],
            driver=DRIVER_NAME,
            simulated=False,
            thermal_state=ThermalState.unknown,
        )
        self._installed: InstalledModel | None = None
        self._report: dict[str, Any] | None = None
        self._run: _Run | None = None

    def discover(self) -> list[DeviceInfo]:
        return [self.device]

    def health(self, device: DeviceInfo) -> DeviceInfo:
        return device.model_copy(update={"status": "ready"})

    def prepare(self, device: DeviceInfo) -> None:
        self._run = None

    def install(self, device: DeviceInfo, artifact_path: Path) -> InstalledModel:
        """Nothing is installed: the artifact's build.json is read to check the job against it."""
        if not zipfile.is_zipfile(artifact_path):
            raise DriverError(f"artifact {artifact_path.name} is not a zip archive")
        with zipfile.ZipFile(artifact_path) as archive:
            names = archive.namelist()
            report = json.loads(archive.read(BUILD_REPORT)) if BUILD_REPORT in names else None
            package_bytes = sum(
                info.file_size for info in archive.infolist() if ".mlpackage/" in info.filename
            )
        self._installed = InstalledModel(
            artifact_sha256=artifact_path.stem,
            package_path=artifact_path,
            package_bytes=package_bytes,
        )
        self._report = report
        return self._installed

    def push(self, device: DeviceInfo, job: HarnessJob) -> None:
        if self._installed is None:
            raise DriverError("no artifact installed on the host")
        if job.variant is None:
            raise DriverError("the job names no variant: the host cannot build its reference model")
        report = self._report
        if report is not None and report.get("variant", {}).get("attention") not in (
            None,
            job.variant.attention.value,
        ):
            raise DriverError(
                f"the artifact was built with attention {report['variant']['attention']}, "
                f"the job asks for {job.variant.attention.value}"
            )
        self._run = _Run(job, self._installed)

    def launch(self, device: DeviceInfo, job: HarnessJob) -> None:
        if self._run is None or self._run.job.run_id != job.run_id:
            raise DriverError(f"run {job.run_id} was not pushed")

    def wait(
        self, device: DeviceInfo, job: HarnessJob, timeout_s: float, cancel: Cancellation
    ) -> None:
        """Run the protocol here, checking for cancellation between prompts."""
        run = self._run
        assert run is not None
        deadline = time.monotonic() + timeout_s
        run.result = measure(run.job, device, cancel, deadline, self.threads)

    def pull_results(self, device: DeviceInfo, job: HarnessJob) -> RunResult:
        if self._run is None or self._run.result is None:
            raise DriverError(f"run {job.run_id} produced no results")
        return self._run.result

    def logs(self, device: DeviceInfo, job: HarnessJob) -> str:
        return ""

    def cleanup(self, device: DeviceInfo, job: HarnessJob) -> None:
        self._run = None
        gc.collect()

    def close(self) -> None:
        pass


def measure(
    job: HarnessJob,
    device: DeviceInfo,
    cancel: Cancellation | None = None,
    deadline: float | None = None,
    threads: int | None = None,
) -> RunResult:
    """The decode sweep of `job` on this CPU, timed with the monotonic clock."""
    import torch

    if threads is not None:
        torch.set_num_threads(threads)
    assert job.variant is not None
    config = resolve_config(job.model, job.variant)
    cancel = cancel or Cancellation()

    started = time.perf_counter()
    engine = TorchStepEngine.build(config, job.variant)
    cold_ms = (time.perf_counter() - started) * 1000
    del engine
    gc.collect()
    cancel.check()
    started = time.perf_counter()
    engine = TorchStepEngine.build(config, job.variant)
    warm_ms = (time.perf_counter() - started) * 1000

    clock = MonotonicClock()
    warm_up(engine, job.prompts[0].token_ids[0], job.warmup_steps)
    prompts: list[PromptResult] = []
    for prompt in job.prompts:
        cancel.check()
        if deadline is not None and time.monotonic() > deadline:
            raise DriverError(f"the host did not finish run {job.run_id} in time")
        prompts.append(run_prompt(engine, clock, prompt, job.decode_tokens))
    return RunResult(
        device_udid=job.device_udid or device.udid,
        device_class=job.device_class,
        product_type=device.product_type,
        os_version=device.os_version,
        driver=DRIVER_NAME,
        simulated=False,
        load_time_cold_ms=cold_ms,
        load_time_warm_ms=warm_ms,
        peak_memory_bytes=model_bytes(engine),
        thermal_state_start=ThermalState.unknown,
        thermal_state_end=ThermalState.unknown,
        timing_model=(
            f"measured on the host CPU ({cpu_name()}, {os.cpu_count()} logical cores, torch "
            f"{torch.__version__}, {torch.get_num_threads()} threads): the PyTorch reference "
            f"decoder in fp32, not Core ML; wall clock per model step"
        ),
        prompts=prompts,
    )
