"""A simulated iPhone: no hardware, no model execution; timings from the roofline model.

Everything the agent does around a run is real (download, unpack and check the artifact,
write the job, read back and validate results.json); only the phone is replaced by a formula,
and every result says so (`simulated=True`, `driver="simulated"`, `timing_model`).

The model (decodebench.timing, docs/noise-model.md), seeded by (run id, device UDID)
so a run reproduces exactly:

- decode latency per token = bytes_per_token / effective bandwidth of the device profile (the
  class's current profile as the server sends it with the run: after a calibration, the same
  calibrated figures the predictions use; the built-in one otherwise), times
  the profile's noise: a device offset (per UDID), a run offset, a thermal slow-down growing over
  the run's sustained work towards the slow-down of the device's thermal state, per-token
  log-normal jitter and rare stalls (a token 5-20x slower); `TimingParameters.noise_scale`
  scales it all, 0 leaving the bare roofline;
- prefill latency per prompt token = decode latency / `prefill_parallelism` (prefill reads
  the weights once per batch of prompt tokens), times one noise factor per prompt;
- load time: cold = fixed + package bytes / cold rate (stands in for the on-device compile),
  warm = fixed + package bytes / warm rate; peak memory = package bytes + runtime overhead
  (the KV state is not modelled).
"""

from __future__ import annotations

import logging
import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path

from agent.artifacts import SHA256_PATTERN, directory_bytes, unpack_mlpackage
from agent.drivers.base import (
    Cancellation,
    DriverError,
    HarnessJob,
    InstalledModel,
)
from decodebench.client import file_sha256
from decodebench.contracts.names import JOB_FILE, RESULTS_FILE, DeviceStatus, Driver
from decodebench.contracts.profiles import DeviceProfile, get_profile
from decodebench.contracts.protocol import DeviceInfo, RunAssignment
from decodebench.contracts.results import PromptResult, RunResult, ThermalState
from decodebench.harness import package_engine
from decodebench.timing import (
    RunNoise,
    TimingParameters,
    decode_latency_s,
    simulate_decode,
)

log = logging.getLogger(__name__)

DRIVER_NAME = Driver.simulated


@dataclass(frozen=True)
class SimulatedDevice:
    udid: str
    device_class: str
    thermal_state: ThermalState = ThermalState.nominal


def describe_timing_model(
    profile: DeviceProfile,
    bytes_per_token: int,
    timing: TimingParameters,
    noise: RunNoise,
    dispatch_ops: int = 0,
    engine: str = "coreml",
) -> str:
    latency_ms = decode_latency_s(profile, bytes_per_token, dispatch_ops) * 1000
    # A Core AI asset's cold load is its specialization for the device (Core AI's compile).
    cold = "load cold (specialization)" if engine == "coreai" else "load cold"
    overhead = (
        f" + dispatched ops ({dispatch_ops:,}) x per-op overhead "
        f"({profile.dispatch_overhead_us:g} us)"
        if profile.dispatch_overhead_us > 0 and dispatch_ops > 0
        else ""
    )
    return (
        f"simulated roofline, no model executed ({engine} package): decode latency per token = bytes_per_token "
        f"({bytes_per_token:,} B) / effective bandwidth ({profile.effective_bandwidth_mb_s:,.1f} "
        f"MB/s){overhead}, {profile.device_class} profile: {profile.source} = {latency_ms:.4f} "
        "ms, times "
        f"{noise.describe()}, seeded by (run, device, prompt); prefill per prompt token = decode "
        f"latency / {timing.prefill_parallelism:g}; {cold} = {timing.cold_load_fixed_ms:g} ms "
        f"+ package bytes / {timing.cold_load_bytes_s / 1e6:g} MB/s, warm = "
        f"{timing.warm_load_fixed_ms:g} ms + package bytes / {timing.warm_load_bytes_s / 1e6:g} "
        f"MB/s; peak memory = package bytes + {timing.runtime_overhead_bytes / 2**20:g} MiB"
    )


def simulate_run(
    job: HarnessJob,
    device: SimulatedDevice,
    package_bytes: int,
    timing: TimingParameters | None = None,
    profile: DeviceProfile | None = None,
    dispatch_ops: int = 0,
) -> RunResult:
    """The results.json a harness on this device would write, from the stated timing model.

    ``profile`` is the device class's current profile as the server sent it with the run (the
    calibrated one after a calibration), so the simulated timing and the predictions use the
    same figures; without one, the built-in profile."""
    timing = timing or TimingParameters()
    if profile is not None and profile.device_class != device.device_class:
        raise DriverError(
            f"run {job.run_id}: the assignment's profile is for {profile.device_class}, "
            f"the device is a {device.device_class}"
        )
    profile = profile or get_profile(device.device_class)
    if job.bytes_per_token <= 0:
        raise DriverError(
            f"run {job.run_id}: bytes_per_token is {job.bytes_per_token}; the simulated device "
            "needs the build's analysed bytes per token"
        )
    run = simulate_decode(
        profile,
        timing,
        job.bytes_per_token,
        device.udid,
        job.run_id,
        [len(prompt.token_ids) for prompt in job.prompts],
        job.decode_tokens,
        device.thermal_state.value,
        dispatch_ops,
    )
    prompts = []
    for prompt, prefill_s, latencies in zip(
        job.prompts, run.prefill_s, run.latencies_s, strict=True
    ):
        latencies_s = [float(latency) for latency in latencies]
        prompts.append(
            PromptResult(
                prompt_index=prompt.index,
                prompt_tokens=len(prompt.token_ids),
                generated_tokens=job.decode_tokens,
                ttft_ms=(float(prefill_s) + latencies_s[0]) * 1000,
                prefill_tok_s=len(prompt.token_ids) / float(prefill_s),
                decode_tok_s=job.decode_tokens / sum(latencies_s),
                token_latencies_ms=[latency * 1000 for latency in latencies_s],
                token_ids=None,
            )
        )
    return RunResult(
        device_udid=device.udid,
        device_class=device.device_class,
        product_type=profile.product_types[0],
        os_version=DRIVER_NAME,
        driver=DRIVER_NAME,
        simulated=True,
        load_time_cold_ms=timing.cold_load_ms(package_bytes),
        load_time_warm_ms=timing.warm_load_ms(package_bytes),
        peak_memory_bytes=timing.peak_memory_bytes(package_bytes),
        thermal_state_start=device.thermal_state,
        thermal_state_end=device.thermal_state,
        timing_model=describe_timing_model(
            profile, job.bytes_per_token, timing, run.noise, dispatch_ops, job.engine
        ),
        prompts=prompts,
    )


def simulated_duration_s(result: RunResult) -> float:
    """How long the run would have taken on the phone: one cold load plus every prompt."""
    prompts_ms = sum(
        prompt.prompt_tokens / prompt.prefill_tok_s * 1000 + sum(prompt.token_latencies_ms)
        for prompt in result.prompts
    )
    return (result.load_time_cold_ms + prompts_ms) / 1000


def _content_address(artifact_path: Path) -> str:
    # The agent's cache already names artifacts by their verified sha256; hash anything else.
    if SHA256_PATTERN.match(artifact_path.stem):
        return artifact_path.stem
    return file_sha256(artifact_path)


@dataclass
class _DeviceState:
    device: SimulatedDevice
    root: Path
    installed: InstalledModel | None = None
    log_lines: list[str] = field(default_factory=list)

    @property
    def documents(self) -> Path:
        return self.root / "Documents"

    def note(self, message: str) -> None:
        self.log_lines.append(message)
        log.debug("[%s] %s", self.device.udid, message)


class SimulatedDriver:
    """Simulated iPhones, one per `SimulatedDevice`, each with a directory under `work_dir`.

    `time_scale` > 0 makes `wait` sleep that fraction of the simulated run time (for demos).
    """

    name = DRIVER_NAME

    def __init__(
        self,
        devices: list[SimulatedDevice],
        work_dir: Path,
        time_scale: float = 0.0,
        timing: TimingParameters | None = None,
    ) -> None:
        if time_scale < 0:
            raise ValueError("time_scale must not be negative")
        for device in devices:
            get_profile(device.device_class)  # refuse unknown classes at start-up, not mid-run
        self.time_scale = time_scale
        self.timing = timing or TimingParameters()
        self._states = {
            device.udid: _DeviceState(device, work_dir / "devices" / device.udid)
            for device in devices
        }
        self._lock = threading.Lock()
        self._assigned: dict[int, tuple[DeviceProfile | None, int]] = {}
        self._infos: dict[str, DeviceInfo] = {}

    def assign(self, device: DeviceInfo, assignment: RunAssignment) -> None:
        """Keep what the server sent with the run for its timing: the device class's current
        profile (calibrated, after a calibration) and the build's dispatched ops, so the
        simulated decode time is the prediction's own formula with the prediction's figures."""
        with self._lock:
            self._assigned[assignment.run_id] = (
                assignment.device_profile,
                assignment.dispatch_ops,
            )

    def discover(self) -> list[DeviceInfo]:
        # The agent lists devices five times a second; a farm of simulated ones would spend a
        # good part of its CPU making the same models again, so each is made once per state.
        found = []
        for state in self._states.values():
            device = state.device
            known = self._infos.get(device.udid)
            if known is None or known.thermal_state != device.thermal_state:
                known = self._infos[device.udid] = DeviceInfo(
                    udid=device.udid,
                    device_class=device.device_class,
                    product_type=get_profile(device.device_class).product_types[0],
                    os_version=DRIVER_NAME,
                    driver=DRIVER_NAME,
                    simulated=True,
                    thermal_state=device.thermal_state,
                )
            found.append(known)
        return found

    def health(self, device: DeviceInfo) -> DeviceInfo:
        self._state(device)
        return device.model_copy(update={"status": DeviceStatus.ready})

    def close(self) -> None:
        pass

    def _state(self, device: DeviceInfo) -> _DeviceState:
        with self._lock:
            state = self._states.get(device.udid)
        if state is None:
            raise DriverError(f"device {device.udid} is not connected to this agent")
        return state

    def prepare(self, device: DeviceInfo) -> None:
        state = self._state(device)
        state.log_lines.clear()
        shutil.rmtree(state.documents, ignore_errors=True)
        state.documents.mkdir(parents=True)
        state.note(f"prepared: thermal state {state.device.thermal_state.value}")

    def install(self, device: DeviceInfo, artifact_path: Path) -> InstalledModel:
        state = self._state(device)
        artifact_sha256 = _content_address(artifact_path)
        if state.installed is not None and state.installed.artifact_sha256 == artifact_sha256:
            state.note(f"artifact {artifact_sha256[:12]} already installed")
            return state.installed
        state.installed = None  # one model installed at a time, like a phone short of storage
        package = unpack_mlpackage(artifact_path, state.root / "installed")
        state.installed = InstalledModel(
            artifact_sha256=artifact_sha256,
            package_path=package,
            package_bytes=directory_bytes(package),
        )
        state.note(f"installed {package.name} ({state.installed.package_bytes:,} bytes)")
        return state.installed

    def push(self, device: DeviceInfo, job: HarnessJob) -> None:
        state = self._state(device)
        (state.documents / JOB_FILE).write_text(job.model_dump_json())
        state.note(f"pushed {JOB_FILE}: {len(job.prompts)} prompts x {job.decode_tokens} tokens")

    def launch(self, device: DeviceInfo, job: HarnessJob) -> None:
        """Run the harness protocol in-process: read job.json, write results.json atomically."""
        state = self._state(device)
        if state.installed is None or state.installed.artifact_sha256 != job.artifact_sha256:
            raise DriverError(
                f"device {device.udid}: artifact {job.artifact_sha256[:12]} not installed"
            )
        pushed = HarnessJob.model_validate_json((state.documents / JOB_FILE).read_text())
        installed_engine = package_engine(state.installed.package_path.name)
        if installed_engine != pushed.engine:
            raise DriverError(
                f"device {device.udid}: the job asks for engine {pushed.engine}, the installed "
                f"artifact is a {installed_engine} package ({state.installed.package_path.name})"
            )
        with self._lock:
            profile, dispatch_ops = self._assigned.pop(pushed.run_id, (None, 0))
        result = simulate_run(
            pushed, state.device, state.installed.package_bytes, self.timing, profile, dispatch_ops
        )
        partial = state.documents / (RESULTS_FILE + ".partial")
        partial.write_text(result.model_dump_json())
        partial.replace(state.documents / RESULTS_FILE)
        state.note(f"harness finished: {simulated_duration_s(result):.2f} s simulated")

    def wait(
        self, device: DeviceInfo, job: HarnessJob, timeout_s: float, cancel: Cancellation
    ) -> None:
        state = self._state(device)
        if self.time_scale == 0:
            return
        result = RunResult.model_validate_json((state.documents / RESULTS_FILE).read_text())
        wall_s = simulated_duration_s(result) * self.time_scale
        cancel.sleep(min(wall_s, timeout_s))
        if wall_s > timeout_s:
            raise DriverError(
                f"device {device.udid}: harness did not finish within {timeout_s:g} s"
            )

    def pull_results(self, device: DeviceInfo, job: HarnessJob) -> RunResult:
        state = self._state(device)
        path = state.documents / RESULTS_FILE
        if not path.exists():
            raise DriverError(f"device {device.udid}: the harness wrote no {RESULTS_FILE}")
        result = RunResult.model_validate_json(path.read_text())
        state.note(f"pulled {RESULTS_FILE}")
        return result

    def logs(self, device: DeviceInfo, job: HarnessJob) -> str:
        return "\n".join(self._state(device).log_lines)

    def cleanup(self, device: DeviceInfo, job: HarnessJob) -> None:
        with self._lock:
            self._assigned.pop(job.run_id, None)
        shutil.rmtree(self._state(device).documents, ignore_errors=True)
