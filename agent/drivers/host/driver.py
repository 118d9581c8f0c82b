"""The host as a device: the built package's own program on this CPU, timed for real.

Core ML packages only (``engines``): a Core AI run is refused before its artifact is fetched,
naming its format, and a Core AI artifact is refused at install.

Not an iPhone and not Core ML: the artifact's ``.mlpackage`` is unpacked and decoded by
:class:`agent.drivers.host.decode.HostEngine`, its weights at their stored precision (int8 and
int4 on PyTorch's weight-packed CPU kernels, palettes decompressed block by block, fp16 as
fp16), stepped through the same decode sweep protocol as the iOS harness
(`decodebench.harness`), with wall-clock timings. Its greedy tokens are the MIL reference
interpreter's for the same package. Results say `driver="host"`, `simulated=False`.

- load: cold = loading the package and packing its weights the first time, warm = again once
  the first copy is dropped;
- peak memory: the process's RSS high-water mark over the decode (reset before it starts);
- roofline: the weight bytes every step reads, against this machine's STREAM triad bandwidth
  (measured once per driver); each run's `timing_model` states both and the fraction of the
  roofline reached, and :class:`HostRoofline` keeps them as numbers;
- thermal state: unknown (not measured on a host).
"""

from __future__ import annotations

import gc
import json
import logging
import os
import platform
import shutil
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from agent.drivers.base import Cancellation, DriverError, HarnessJob, InstalledModel
from agent.drivers.host.decode import HostEngine
from agent.drivers.host.memory import (
    StreamBandwidth,
    peak_rss_bytes,
    reset_peak_rss,
    stream_bandwidth,
)
from decodebench.archives import AIMODEL_SUFFIX
from decodebench.contracts.names import REPORT_NAME, DeviceStatus, Driver, FormatName
from decodebench.contracts.protocol import DeviceInfo
from decodebench.contracts.results import PromptResult, RunResult, ThermalState
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


class HostRoofline(BaseModel):
    """A host run against this machine's memory roofline (weights read once per step)."""

    model_config = ConfigDict(frozen=True)

    bandwidth: StreamBandwidth
    weight_bytes_per_step: int = Field(gt=0)
    kernels: dict[str, int] = Field(description="linear layers per kernel kind")
    roofline_tok_s: float = Field(gt=0, description="triad bandwidth / weight bytes per step")
    measured_tok_s: float = Field(gt=0, description="mean decode tok/s over the prompts")

    @property
    def fraction(self) -> float:
        return self.measured_tok_s / self.roofline_tok_s

    def text(self) -> str:
        return (
            f"{self.weight_bytes_per_step} weight bytes per step; {self.bandwidth.text()}; "
            f"roofline {self.roofline_tok_s:.1f} tok/s, measured {self.measured_tok_s:.1f} "
            f"tok/s = {self.fraction:.1%} of the roofline"
        )


@dataclass
class _Run:
    job: HarnessJob
    installed: InstalledModel
    result: RunResult | None = None
    roofline: HostRoofline | None = None


class HostDriver:
    name = DRIVER_NAME
    # The formats it decodes: its engine reads Core ML programs (the runner refuses the others).
    engines = (FormatName.coreml.value,)

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
        self._bandwidth: StreamBandwidth | None = None

    def discover(self) -> list[DeviceInfo]:
        return [self.device]

    def health(self, device: DeviceInfo) -> DeviceInfo:
        return device.model_copy(update={"status": DeviceStatus.ready})

    def prepare(self, device: DeviceInfo) -> None:
        self._run = None

    def install(self, device: DeviceInfo, artifact_path: Path) -> InstalledModel:
        """The artifact's package is unpacked under the work directory; build.json is kept to
        check the job against it."""
        if not zipfile.is_zipfile(artifact_path):
            raise DriverError(f"artifact {artifact_path.name} is not a zip archive")
        target = self.work_dir / artifact_path.stem
        with zipfile.ZipFile(artifact_path) as archive:
            names = archive.namelist()
            report = json.loads(archive.read(BUILD_REPORT)) if BUILD_REPORT in names else None
            members = [name for name in names if name.split("/", 1)[0].endswith(".mlpackage")]
            if any(name.split("/", 1)[0].endswith(AIMODEL_SUFFIX) for name in names):
                raise DriverError(
                    f"artifact {artifact_path.name} is a Core AI asset (.aimodel, format "
                    "coreai); the host driver decodes Core ML packages (format coreml) only"
                )
            if not members:
                raise DriverError(f"artifact {artifact_path.name} holds no .mlpackage")
            package_bytes = sum(archive.getinfo(name).file_size for name in members)
            if target.exists():
                shutil.rmtree(target)
            archive.extractall(target, members)
        self._installed = InstalledModel(
            artifact_sha256=artifact_path.stem,
            package_path=target / members[0].split("/", 1)[0],
            package_bytes=package_bytes,
        )
        self._report = report
        return self._installed

    def push(self, device: DeviceInfo, job: HarnessJob) -> None:
        if self._installed is None:
            raise DriverError("no artifact installed on the host")
        report = self._report
        built = (report or {}).get("variant", {}).get("attention")
        if job.variant is not None and built not in (None, job.variant.attention.value):
            raise DriverError(
                f"the artifact was built with attention {built}, "
                f"the job asks for {job.variant.attention.value}"
            )
        self._run = _Run(job, self._installed)

    def launch(self, device: DeviceInfo, job: HarnessJob) -> None:
        if self._run is None or self._run.job.run_id != job.run_id:
            raise DriverError(f"run {job.run_id} was not pushed")

    def bandwidth(self) -> StreamBandwidth:
        """This machine's STREAM bandwidth, measured on first use (part of the host's profile)."""
        if self._bandwidth is None:
            self._bandwidth = stream_bandwidth()
        return self._bandwidth

    def wait(
        self, device: DeviceInfo, job: HarnessJob, timeout_s: float, cancel: Cancellation
    ) -> None:
        """Run the protocol here, checking for cancellation between prompts."""
        run = self._run
        assert run is not None
        deadline = time.monotonic() + timeout_s
        run.result, run.roofline = measure(
            run.installed.package_path, run.job, device, self.bandwidth(), cancel, deadline,
            self.threads,
        )  # fmt: skip

    def roofline(self, job: HarnessJob) -> HostRoofline | None:
        """The roofline figures of the run just measured, as numbers."""
        if self._run is None or self._run.job.run_id != job.run_id:
            return None
        return self._run.roofline

    def pull_results(self, device: DeviceInfo, job: HarnessJob) -> RunResult:
        if self._run is None or self._run.result is None:
            raise DriverError(f"run {job.run_id} produced no results")
        return self._run.result

    def logs(self, device: DeviceInfo, job: HarnessJob) -> str:
        return ""

    def cleanup(self, device: DeviceInfo, job: HarnessJob) -> None:
        if self._installed is not None:
            shutil.rmtree(self._installed.package_path.parent, ignore_errors=True)
        self._installed = None
        gc.collect()

    def close(self) -> None:
        pass


def load_engine(package: Path) -> tuple[HostEngine, float]:
    started = time.perf_counter()
    try:
        engine = HostEngine(package)
    except ValueError as error:  # MilError and the interpreter's own errors
        raise DriverError(f"the host cannot decode {package.name}: {error}") from None
    return engine, (time.perf_counter() - started) * 1000


def measure(
    package: Path,
    job: HarnessJob,
    device: DeviceInfo,
    bandwidth: StreamBandwidth,
    cancel: Cancellation | None = None,
    deadline: float | None = None,
    threads: int | None = None,
) -> tuple[RunResult, HostRoofline]:
    """The decode sweep of `job` over `package` on this CPU, timed with the monotonic clock."""
    import torch

    if threads is not None:
        torch.set_num_threads(threads)
    cancel = cancel or Cancellation()
    engine, cold_ms = load_engine(package)
    del engine
    gc.collect()
    cancel.check()
    engine, warm_ms = load_engine(package)

    clock = MonotonicClock()
    warm_up(engine, job.prompts[0].token_ids[0], job.warmup_steps)
    reset_peak_rss()
    prompts: list[PromptResult] = []
    for prompt in job.prompts:
        cancel.check()
        if deadline is not None and time.monotonic() > deadline:
            raise DriverError(f"the host did not finish run {job.run_id} in time")
        prompts.append(run_prompt(engine, clock, prompt, job.decode_tokens))
    peak = peak_rss_bytes()
    step_bytes = engine.interpreter.weight_bytes_per_step
    roofline = HostRoofline(
        bandwidth=bandwidth,
        weight_bytes_per_step=step_bytes,
        kernels=engine.interpreter.kinds(),
        roofline_tok_s=bandwidth.triad_bytes_per_s / step_bytes,
        measured_tok_s=sum(prompt.decode_tok_s for prompt in prompts) / len(prompts),
    )
    result = RunResult(
        device_udid=job.device_udid or device.udid,
        device_class=job.device_class,
        product_type=device.product_type,
        os_version=device.os_version,
        driver=DRIVER_NAME,
        simulated=False,
        load_time_cold_ms=cold_ms,
        load_time_warm_ms=warm_ms,
        peak_memory_bytes=peak,
        thermal_state_start=ThermalState.unknown,
        thermal_state_end=ThermalState.unknown,
        timing_model=(
            f"measured on the host CPU ({cpu_name()}, {os.cpu_count()} logical cores, torch "
            f"{torch.__version__}, {torch.get_num_threads()} threads): the package's program, "
            f"weights at stored precision ({roofline.kernels}), not Core ML; wall clock per "
            f"model step; peak memory = RSS high-water mark of the decode; {roofline.text()}"
        ),
        prompts=prompts,
    )
    return result, roofline
