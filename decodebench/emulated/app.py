"""The harness app of an emulated iPhone: the decode sweep protocol in Python, on a worker thread.

It does what ios_harness does, minus Core ML: read ``job.json``, check the pushed package, run
warm-up and every prompt through a step engine, write ``results.json`` atomically and then the
``done`` marker. The step engine is the roofline clock of the device's profile (virtual time),
with greedy tokens from the PyTorch reference decoder when that is cheap enough. After the
computation the app sleeps ``time_scale`` x the run's virtual duration, so a demo takes time.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ValidationError

from decodebench.emulated.faults import FaultKind
from decodebench.emulated.reference import (
    CHEAP_PARAMETERS,
    ReferenceCache,
    parameter_estimate,
    resolve_config,
)
from decodebench.emulated.timing import (
    RooflineClock,
    RunNoise,
    TimingParameters,
    TokenSource,
    prompt_seed,
)
from decodebench.harness import (
    COMPLETE_MARKER,
    DONE_MARKER,
    HARNESS_BUNDLE_ID,
    HARNESS_LOG,
    HARNESS_PROCESS_NAME,
    JOB_FILE,
    PARTIAL_SUFFIX,
    RESULTS_FILE,
    DoneMarker,
    HarnessJob,
    results_digest,
    run_prompts,
)
from decodebench.profiles import DeviceProfile, get_profile
from decodebench.protocol import RunResult

if TYPE_CHECKING:
    from decodebench.emulated.device import AppProcess, EmulatedDevice

log = logging.getLogger(__name__)

DRIVER_NAME = "emulated"
_EXECUTOR = ThreadPoolExecutor(max_workers=16, thread_name_prefix="emulated-app")
REFERENCES = ReferenceCache()


class LaunchRefused(Exception):
    """The device would not launch the app; the message is what it says."""


class AppCrashed(Exception):
    pass


def launch_app(device: EmulatedDevice, bundle_id: str, arguments: list[str]) -> int:
    condition = device.condition
    if device.faults.take(FaultKind.lock_during_run):
        condition.locked = True
    if condition.locked:
        raise LaunchRefused("Locked: the device is locked; unlock it to launch applications")
    if not condition.developer_mode:
        raise LaunchRefused("DeveloperModeDisabled: turn on Developer Mode to launch applications")
    if bundle_id not in device.apps:
        raise LaunchRefused(f"ApplicationLookupFailed: {bundle_id} is not installed")
    if bundle_id != HARNESS_BUNDLE_ID:
        raise LaunchRefused(f"NotSupported: the emulator only runs {HARNESS_BUNDLE_ID}")
    process = device.new_process(bundle_id)
    _EXECUTOR.submit(_run_process, device, process, arguments)
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


def _run_process(device: EmulatedDevice, process: AppProcess, arguments: list[str]) -> None:
    documents = device.documents(process.bundle_id)
    say = HarnessLog(device, process, documents)
    try:
        say(f"launched with arguments {arguments}")
        state, reason = run_harness(device, process, documents, say)
    except AppCrashed as crash:
        say(f"fatal error: {crash}")
        state, reason = "crashed", str(crash)
    except Exception as error:  # the emulator must not die with its app
        log.exception("%r: emulated harness failed", device)
        state, reason = "crashed", f"{type(error).__name__}: {error}"
    device.end_process(process, state, reason)


def run_harness(
    device: EmulatedDevice, process: AppProcess, documents: Path, say: HarnessLog
) -> tuple[str, str]:
    """The app's main(); returns its final (state, reason)."""
    try:
        job = HarnessJob.model_validate_json((documents / JOB_FILE).read_text())
    except (OSError, ValidationError) as error:
        _finish(documents, DoneMarker(run_id=-1, ok=False, error=f"unreadable {JOB_FILE}: {error}"))
        say(f"no usable {JOB_FILE}: {error}")
        return "exited", "exit code 1"
    package = documents / job.package_path
    if not (package.parent / COMPLETE_MARKER).exists() or not (package / "Manifest.json").is_file():
        message = f"model package {job.package_path} is missing or incomplete"
        _finish(documents, DoneMarker(run_id=job.run_id, ok=False, error=message))
        say(message)
        return "exited", "exit code 1"
    package_bytes = sum(path.stat().st_size for path in package.rglob("*") if path.is_file())
    say(f"run {job.run_id}: compiling {job.package_path} ({package_bytes:,} bytes)")
    if device.faults.take(FaultKind.app_crash):
        raise AppCrashed("EXC_BAD_ACCESS (SIGSEGV) while loading the model")
    profile = get_profile(device.identity.device_class)
    tokens = token_source(device, job, package)
    noise = RunNoise.for_run(
        profile, device.timing, device.udid, job.run_id, device.condition.thermal_state.value
    )
    clock = RooflineClock(
        profile, job.bytes_per_token, noise, prompt_seed(job.run_id, device.udid, 0), tokens
    )
    say(f"run {job.run_id}: {len(job.prompts)} prompts x {job.decode_tokens} tokens")
    if tokens is not None:
        with tokens.lock:
            prompts = run_prompts(clock, clock, job.prompts, job.decode_tokens, job.warmup_steps)
    else:
        prompts = run_prompts(clock, clock, job.prompts, job.decode_tokens, job.warmup_steps)
    timing = device.timing
    condition = device.condition
    result = RunResult(
        device_udid=job.device_udid or device.udid,
        device_class=job.device_class,
        product_type=device.identity.product_type,
        os_version=device.identity.product_version,
        driver=job.driver or DRIVER_NAME,
        simulated=True,
        load_time_cold_ms=timing.cold_load_ms(package_bytes),
        load_time_warm_ms=timing.warm_load_ms(package_bytes),
        peak_memory_bytes=timing.peak_memory_bytes(package_bytes),
        thermal_state_start=condition.thermal_state,
        thermal_state_end=condition.thermal_state,
        timing_model=describe_emulated_timing(profile, job.bytes_per_token, timing, noise, tokens),
        prompts=prompts,
    )
    virtual_s = timing.cold_load_ms(package_bytes) / 1000 + clock.elapsed_s
    wall_s = virtual_s * device.time_scale
    if device.faults.take(FaultKind.slow):
        say(f"run {job.run_id}: running slowly (thermal throttling?)")
        wall_s += device.slow_s
    if process.kill.wait(wall_s):
        say(f"run {job.run_id}: terminated before finishing")
        return "killed", process.exit_reason or "killed"
    data = result.model_dump_json(indent=1).encode()
    partial = documents / (RESULTS_FILE + PARTIAL_SUFFIX)
    partial.write_bytes(data)
    partial.replace(documents / RESULTS_FILE)
    _finish(documents, DoneMarker(run_id=job.run_id, ok=True, results_sha256=results_digest(data)))
    say(f"run {job.run_id}: done, {virtual_s:.2f} s emulated")
    return "exited", "exit code 0"


def _finish(documents: Path, marker: DoneMarker) -> None:
    partial = documents / (DONE_MARKER + PARTIAL_SUFFIX)
    partial.write_text(json.dumps(marker.model_dump(mode="json")))
    partial.replace(documents / DONE_MARKER)


def token_source(device: EmulatedDevice, job: HarnessJob, package: Path) -> TokenSource | None:
    """Greedy tokens for this run, per the device's `tokens` setting (see device.TOKEN_SOURCES)."""
    if device.tokens == "off" or job.variant is None:
        return None
    if device.tokens == "mil":
        return MIL_SESSIONS.get(package)
    config = resolve_config(job.model, job.variant)
    if device.tokens == "auto" and parameter_estimate(config) > CHEAP_PARAMETERS:
        return None
    return REFERENCES.get(job.model, job.variant)


class MilTokens(TokenSource):
    """The pushed package itself, run by the MIL reference interpreter (decodebench.mil)."""

    source = "the pushed package run by the MIL reference interpreter"

    def __init__(self, package: Path) -> None:
        from decodebench.mil.verify import open_session

        self.session = open_session(package)
        self.lock = threading.Lock()

    def reset(self) -> None:
        self.session.reset()

    def step(self, token: int, position: int) -> int:
        return self.session.next_token(token, position)


class MilSessions:
    """One interpreter session per package path (loading one parses the whole program)."""

    def __init__(self, capacity: int = 2) -> None:
        self._capacity = capacity
        self._sessions: dict[Path, MilTokens] = {}
        self._lock = threading.Lock()

    def get(self, package: Path) -> MilTokens:
        with self._lock:
            session = self._sessions.pop(package, None) or MilTokens(package)
            self._sessions[package] = session
            while len(self._sessions) > self._capacity:
                self._sessions.pop(next(iter(self._sessions)))
            return session


MIL_SESSIONS = MilSessions()


def describe_emulated_timing(
    profile: DeviceProfile,
    bytes_per_token: int,
    timing: TimingParameters,
    noise: RunNoise,
    tokens: TokenSource | None,
) -> str:
    latency_ms = 1000 / profile.predicted_tok_s(bytes_per_token)
    tokens_from = f"greedy tokens from {tokens.source}" if tokens is not None else "no token ids"
    return (
        f"emulated iPhone (fake usbmuxd, lockdown, installation_proxy, house_arrest/AFC; no Core "
        f"ML executed): every model step = bytes_per_token ({bytes_per_token:,} B) / effective "
        f"bandwidth ({profile.effective_bandwidth_mb_s:,.1f} MB/s, {profile.device_class} profile: "
        f"{profile.source}) = {latency_ms:.4f} ms, times {noise.describe()}, seeded by (run, "
        f"device); prefill steps "
        f"the prompt one token at a time, as the converted model does; load cold = "
        f"{timing.cold_load_fixed_ms:g} ms + package bytes / {timing.cold_load_bytes_s / 1e6:g} "
        f"MB/s, warm = {timing.warm_load_fixed_ms:g} ms + package bytes / "
        f"{timing.warm_load_bytes_s / 1e6:g} MB/s; peak memory = package bytes + "
        f"{timing.runtime_overhead_bytes / 2**20:g} MiB; {tokens_from}"
    )
