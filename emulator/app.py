"""The harness app of an emulated iPhone: the decode sweep protocol in Python, on a worker thread.

It does what ios_harness does, minus Core ML and Core AI: read ``job.json`` (a missing,
unreadable or out-of-bounds job, or one of another protocol version, still ends with a done
marker saying why), check the pushed package of the job's engine (an ``.mlpackage`` or an
``.aimodel``), run warm-up and every prompt through a step engine, write ``results.json``
atomically and then the ``done`` marker. The step engine is the roofline clock of the device's
profile (virtual time); greedy tokens come from the pushed package itself when it is small
enough, run by the MIL interpreter (Core ML) or the project's Core AI engine (Core AI), or from
the source the device is set to (``emulator.run_tokens``). Around the steps it measures what the phone's harness measures, by
the same definitions (``decodebench.harness``): the footprint sampled after every step (a
stated model: runtime + weights + KV cache), the compile peak apart, the thermal state after
every prompt and a bounded wait for nominal, and an ``interrupt`` fault makes the app leave the
foreground mid-run (``ok: false``, reason ``interrupted``). After the computation the app
sleeps ``time_scale`` x the run's virtual duration, so a demo takes time.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ValidationError

from decodebench.contracts.names import Driver
from decodebench.contracts.profiles import DeviceProfile, get_profile
from decodebench.contracts.results import RunResult, ThermalState
from decodebench.harness import (
    DONE_MARKER,
    HARNESS_LOG,
    HARNESS_PROCESS_NAME,
    HARNESS_PROTOCOL_VERSION,
    JOB_FILE,
    PARTIAL_SUFFIX,
    RESULTS_FILE,
    RUN_ID_ENVIRONMENT,
    UNKNOWN_RUN_ID,
    DoneMarker,
    FailureReason,
    HarnessJob,
    RunInterrupted,
    results_digest,
    run_prompts,
)
from decodebench.timing import (
    RooflineClock,
    RunNoise,
    TimingParameters,
    TokenSource,
    prompt_seed,
)
from emulator.faults import FaultKind
from emulator.run_tokens import ARTIFACT_ERRORS, package_ready, token_source
from emulator.run_watch import EmulatedObserver, Footprint, thermal_wait_ms

if TYPE_CHECKING:
    from emulator.device import AppProcess, EmulatedDevice

log = logging.getLogger(__name__)

DRIVER_NAME = Driver.emulated
_EXECUTOR = ThreadPoolExecutor(max_workers=16, thread_name_prefix="emulated-app")


HARNESS_PROTOCOL_KEY = "DecodebenchHarnessProtocol"  # Info.plist key of the harness app


class LaunchRefused(Exception):
    """The device would not launch the app; the message is what it says."""


class AppCrashed(Exception):
    pass


def launch_app(
    device: EmulatedDevice,
    bundle_id: str,
    arguments: list[str],
    environment: Mapping[str, str] | None = None,
) -> int:
    condition = device.condition
    if device.faults.take(FaultKind.lock_during_run):
        condition.locked = True
    if condition.locked:
        raise LaunchRefused("Locked: the device is locked; unlock it to launch applications")
    if not condition.developer_mode:
        raise LaunchRefused("DeveloperModeDisabled: turn on Developer Mode to launch applications")
    record = device.apps.get(bundle_id)
    if record is None:
        raise LaunchRefused(f"ApplicationLookupFailed: {bundle_id} is not installed")
    # Any bundle identifier (operators rename it for their team), as long as it is the harness.
    if HARNESS_PROTOCOL_KEY not in record.info:
        raise LaunchRefused(
            f"NotSupported: {bundle_id} declares no {HARNESS_PROTOCOL_KEY}; the emulator only "
            "runs the decodebench harness"
        )
    process = device.new_process(bundle_id)
    _EXECUTOR.submit(_run_process, device, process, arguments, dict(environment or {}))
    return process.pid


class HarnessLog:
    """Lines to Documents/harness.log and to the device syslog, like NSLog from the app."""

    def __init__(self, device: EmulatedDevice, process: AppProcess, documents: Path) -> None:
        self._device = device
        self._prefix = f"{HARNESS_PROCESS_NAME}[{process.pid}]"
        self._path = documents / HARNESS_LOG
        self._lock = threading.Lock()

    def __call__(self, message: str) -> None:
        stamp = time.strftime("%H:%M:%S")
        with self._lock, self._path.open("a") as out:
            out.write(f"{stamp} {message}\n")
        self._device.syslog.emit(f"{stamp} {self._prefix} <Notice>: {message}")


def _run_process(
    device: EmulatedDevice, process: AppProcess, arguments: list[str], environment: dict[str, str]
) -> None:
    documents = device.documents(process.bundle_id)
    say = HarnessLog(device, process, documents)
    try:
        say(f"launched with arguments {arguments}")
        state, reason = run_harness(device, process, documents, say, environment)
    except AppCrashed as crash:
        say(f"fatal error: {crash}")
        state, reason = "crashed", str(crash)
    except Exception as error:  # the emulator must not die with its app
        log.exception("%r: emulated harness failed", device)
        state, reason = "crashed", f"{type(error).__name__}: {error}"
    device.end_process(process, state, reason)


class JobRefused(Exception):
    """job.json cannot be run; the done marker says why."""

    def __init__(self, run_id: int, reason: FailureReason, message: str) -> None:
        super().__init__(message)
        self.run_id, self.reason = run_id, reason


def read_job(documents: Path, environment: Mapping[str, str]) -> HarnessJob:
    """The job, or JobRefused with the run it belonged to (from the job, else the launch)."""
    launched = environment.get(RUN_ID_ENVIRONMENT, "")
    run_id = int(launched) if launched.lstrip("-").isdigit() else UNKNOWN_RUN_ID
    path = documents / JOB_FILE
    if not path.is_file():
        raise JobRefused(run_id, FailureReason.missing_job, f"no {JOB_FILE} in Documents")
    try:
        raw = json.loads(path.read_bytes())
    except (OSError, ValueError) as error:
        raise JobRefused(run_id, FailureReason.bad_job, f"unreadable {JOB_FILE}: {error}") from None
    if isinstance(raw, dict) and isinstance(raw.get("run_id"), int):
        run_id = raw["run_id"]
    version = raw.get("protocol_version") if isinstance(raw, dict) else None
    if isinstance(version, int) and version != HARNESS_PROTOCOL_VERSION:
        raise JobRefused(
            run_id,
            FailureReason.protocol_version,
            f"{JOB_FILE} speaks harness protocol {version}, the harness speaks "
            f"{HARNESS_PROTOCOL_VERSION}: install the harness of the agent's release",
        )
    try:
        return HarnessJob.model_validate(raw)
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in item['loc']) or 'job'}: {item['msg']}"
            for item in error.errors()
        )
        raise JobRefused(
            run_id, FailureReason.bad_job, f"unusable {JOB_FILE}: {problems}"
        ) from None


def run_harness(
    device: EmulatedDevice,
    process: AppProcess,
    documents: Path,
    say: HarnessLog,
    environment: Mapping[str, str] | None = None,
) -> tuple[str, str]:
    """The app's main(); returns its final (state, reason)."""
    try:
        job = read_job(documents, environment or {})
    except JobRefused as refused:
        return _failed(documents, say, refused.run_id, refused.reason, str(refused))
    package = documents / job.package_path
    if not package_ready(package, job.engine):
        message = f"{job.engine} model package {job.package_path} is missing or incomplete"
        return _failed(documents, say, job.run_id, FailureReason.missing_package, message)
    package_bytes = sum(path.stat().st_size for path in package.rglob("*") if path.is_file())
    say(f"run {job.run_id}: compiling {job.package_path} ({package_bytes:,} bytes)")
    if device.faults.take(FaultKind.app_crash):
        raise AppCrashed("EXC_BAD_ACCESS (SIGSEGV) while loading the model")
    profile, dispatch_ops = _profile_of(device, job.run_id)
    timing = device.timing
    try:
        tokens = token_source(device, job, package, package_bytes, say)
        footprint = Footprint.of(job, package_bytes, timing.runtime_overhead_bytes)
        observer = EmulatedObserver(device, job, footprint)
        condition = device.condition
        waited_ms = thermal_wait_ms(condition.thermal_state, job.thermal_wait_s)
        thermal_start = condition.thermal_state
        noise, clock = _clock(device, job, profile, tokens, dispatch_ops, thermal_start)
        say(f"run {job.run_id}: {len(job.prompts)} prompts x {job.decode_tokens} tokens")
        with tokens.lock if tokens is not None else nullcontext():
            prompts = run_prompts(
                clock, clock, job.prompts, job.decode_tokens, job.warmup_steps, observer
            )
    except RunInterrupted as interrupted:
        message = f"interrupted: {interrupted}; the run is abandoned"
        return _failed(documents, say, job.run_id, FailureReason.interrupted, message)
    except ARTIFACT_ERRORS as error:
        return _failed(documents, say, job.run_id, FailureReason.model_error, str(error))
    result = RunResult(
        device_udid=job.device_udid or device.udid,
        device_class=job.device_class,
        product_type=device.identity.product_type,
        os_version=device.identity.product_version,
        driver=job.driver or DRIVER_NAME,
        simulated=True,
        load_time_cold_ms=timing.cold_load_ms(package_bytes),
        load_time_warm_ms=timing.warm_load_ms(package_bytes),
        peak_memory_bytes=observer.decode_peak_bytes,
        compile_peak_memory_bytes=footprint.compile_peak_bytes,
        low_power_mode=False,
        thermal_wait_ms=waited_ms,
        prompt_thermal_states=observer.thermal_samples,
        thermal_state_start=thermal_start,
        thermal_state_end=condition.thermal_state,
        timing_model=describe_emulated_timing(
            profile, job.bytes_per_token, timing, noise, tokens, dispatch_ops, job.engine
        )
        + f"; {footprint.describe()}",
        prompts=prompts,
    )
    virtual_s = timing.cold_load_ms(package_bytes) / 1000 + (waited_ms / 1000) + clock.elapsed_s
    return _deliver(device, process, documents, say, job.run_id, result, virtual_s)


def _profile_of(device: EmulatedDevice, run_id: int) -> tuple[DeviceProfile, int]:
    """The profile the run is timed with, and the dispatch ops the agent assigned it."""
    assigned, dispatch_ops = device.assigned_timing.pop(run_id, (None, 0))
    profile = get_profile(device.identity.device_class)
    if assigned is not None and assigned.device_class == profile.device_class:
        profile = assigned  # the server's current (calibrated) profile, as predictions use
    return profile, dispatch_ops


def _clock(
    device: EmulatedDevice,
    job: HarnessJob,
    profile: DeviceProfile,
    tokens: TokenSource | None,
    dispatch_ops: int,
    thermal_start: ThermalState,
) -> tuple[RunNoise, RooflineClock]:
    """The run's noise and its roofline clock."""
    # The run's thermal slow-down starts from the state it starts in (read once, by the caller).
    noise = RunNoise.for_run(profile, device.timing, device.udid, job.run_id, thermal_start.value)
    clock = RooflineClock(
        profile,
        job.bytes_per_token,
        noise,
        prompt_seed(job.run_id, device.udid, 0),
        tokens,
        dispatch_ops,
    )
    return noise, clock


def _deliver(
    device: EmulatedDevice,
    process: AppProcess,
    documents: Path,
    say: HarnessLog,
    run_id: int,
    result: RunResult,
    virtual_s: float,
) -> tuple[str, str]:
    """Wait out the run's (scaled) time, unless the app is killed first, then write its results
    and the done marker."""
    wall_s = virtual_s * device.time_scale
    if device.faults.take(FaultKind.slow):
        say(f"run {run_id}: running slowly (thermal throttling?)")
        wall_s += device.slow_s
    if process.kill.wait(wall_s):
        say(f"run {run_id}: terminated before finishing")
        return "killed", process.exit_reason or "killed"
    data = result.model_dump_json(indent=1).encode()
    partial = documents / (RESULTS_FILE + PARTIAL_SUFFIX)
    partial.write_bytes(data)
    partial.replace(documents / RESULTS_FILE)
    _finish(documents, DoneMarker(run_id=run_id, ok=True, results_sha256=results_digest(data)))
    say(f"run {run_id}: done, {virtual_s:.2f} s emulated")
    return "exited", "exit code 0"


def _failed(
    documents: Path, say: HarnessLog, run_id: int, reason: FailureReason, message: str
) -> tuple[str, str]:
    _finish(documents, DoneMarker(run_id=run_id, ok=False, error=message, reason=reason))
    say(f"run {run_id}: failed ({reason.value}): {message}")
    return "exited", "exit code 0" if reason == FailureReason.interrupted else "exit code 1"


def _finish(documents: Path, marker: DoneMarker) -> None:
    partial = documents / (DONE_MARKER + PARTIAL_SUFFIX)
    partial.write_text(json.dumps(marker.model_dump(mode="json")))
    partial.replace(documents / DONE_MARKER)


def describe_emulated_timing(
    profile: DeviceProfile,
    bytes_per_token: int,
    timing: TimingParameters,
    noise: RunNoise,
    tokens: TokenSource | None,
    dispatch_ops: int = 0,
    engine: str = "coreml",
) -> str:
    latency_ms = 1000 * profile.seconds_per_token(bytes_per_token, dispatch_ops)
    overhead = (
        f" + dispatched ops ({dispatch_ops:,}) x per-op overhead "
        f"({profile.dispatch_overhead_us:g} us)"
        if profile.dispatch_overhead_us > 0 and dispatch_ops > 0
        else ""
    )
    tokens_from = f"greedy tokens from {tokens.source}" if tokens is not None else "no token ids"
    runtime, cold = (
        ("Core AI", "load cold (specialization)")
        if engine == "coreai"
        else ("Core ML", "load cold")
    )
    return (
        f"emulated iPhone (fake usbmuxd, lockdown, installation_proxy, house_arrest/AFC; no "
        f"{runtime} executed): every model step = bytes_per_token ({bytes_per_token:,} B) / effective "
        f"bandwidth ({profile.effective_bandwidth_mb_s:,.1f} MB/s){overhead}, "
        f"{profile.device_class} profile: {profile.source} = {latency_ms:.4f} ms, times {noise.describe()}, seeded by (run, "
        f"device); prefill steps "
        f"the prompt one token at a time, as the converted model does; {cold} = "
        f"{timing.cold_load_fixed_ms:g} ms + package bytes / {timing.cold_load_bytes_s / 1e6:g} "
        f"MB/s, warm = {timing.warm_load_fixed_ms:g} ms + package bytes / "
        f"{timing.warm_load_bytes_s / 1e6:g} MB/s; {tokens_from}"
    )
