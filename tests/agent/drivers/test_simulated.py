"""The simulated iPhone driver, the run lifecycle around it, and the agent's local pieces.

Artifacts are real zip files of an .mlpackage directory laid out as coremltools saves one.
The loop against a real server is covered by the end-to-end test.
"""

from __future__ import annotations

import hashlib
import json
import statistics
import threading
import time
import zipfile
from pathlib import Path

import pytest

from agent.artifacts import ArtifactCache, unpack_mlpackage
from agent.config import AgentSettings, parse_settings, simulated_udid
from agent.drivers.base import (
    ArtifactError,
    Cancellation,
    DriverError,
    HarnessJob,
    RunCancelled,
    run_on_device,
)
from agent.drivers.simulated import (
    SimulatedDevice,
    SimulatedDriver,
    TimingParameters,
    simulate_run,
)
from agent.main import (
    Agent,
    RegistrationRefused,
    ServerUnreachable,
    is_transient,
    register_with_backoff,
)
from agent.runner import JobError, ResultMismatch, build_job, check_result, failure_reason
from decodebench.client import ApiError, DecodebenchClient
from decodebench.contracts.domain import VariantSpec
from decodebench.contracts.profiles import IPHONE_16_PRO, IPHONE_17_PRO, UnknownDeviceClass
from decodebench.contracts.protocol import AgentRegistration, DeviceInfo, RunAssignment
from decodebench.contracts.results import RunResult
from decodebench.prompts import builtin_prompts

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


@pytest.fixture
def artifact(tmp_path: Path) -> Path:
    package = write_package(tmp_path / "build")
    return content_addressed(zip_directory(package, tmp_path / "artifact.zip"))


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


# The timing model


def test_without_noise_decode_rate_is_bandwidth_over_bytes_per_token(
    tmp_path: Path, artifact: Path
) -> None:
    result = simulate(tmp_path, artifact, noise_scale=0)
    roofline_tok_s = IPHONE_17_PRO.effective_bandwidth_bytes_s / BYTES_PER_TOKEN

    for prompt in result.prompts:
        assert prompt.decode_tok_s == pytest.approx(roofline_tok_s, rel=1e-9)
    assert "no noise" in result.timing_model


def test_with_default_noise_the_run_stays_near_the_roofline(tmp_path: Path, artifact: Path) -> None:
    result = simulate(tmp_path, artifact)
    roofline_tok_s = IPHONE_17_PRO.effective_bandwidth_bytes_s / BYTES_PER_TOKEN

    # Device and run offsets (sigma 2% and 1%) move the whole run; 15% is over 4 sigma.
    assert aggregate_tok_s(result) == pytest.approx(roofline_tok_s, rel=0.15)
    latencies = [ms for p in result.prompts for ms in p.token_latencies_ms]
    assert statistics.pstdev(latencies) / statistics.mean(latencies) > 0.02
    assert "device offset" in result.timing_model and "stalls 5-20x" in result.timing_model


def test_the_driver_times_with_the_profile_the_assignment_carries(
    tmp_path: Path, artifact: Path
) -> None:
    """The server sends its current profile (calibrated) and the build's dispatched ops with
    the run; the driver's decode time is then that profile's prediction, not the built-in one."""
    calibrated = IPHONE_17_PRO.model_copy(
        update={
            "effective_bandwidth_mb_s": 40_000.0,
            "dispatch_overhead_us": 5.0,
            "calibrated_parameters": ("effective_bandwidth_mb_s", "dispatch_overhead_us"),
            "source": "calibration 7",
        }  # fmt: skip
    )
    assignment = assignment_for(artifact).model_copy(
        update={"device_profile": calibrated, "dispatch_ops": 2_000}
    )
    driver = SimulatedDriver(
        [SimulatedDevice("sim-test-0", "iphone-17-pro")],
        tmp_path / "work",
        timing=TimingParameters(noise_scale=0),
    )
    driver.assign(driver.discover()[0], assignment)
    result = run_on_device(
        driver, driver.discover()[0], artifact, build_job(assignment), Cancellation(), 60
    )
    expected = calibrated.predicted_tok_s(BYTES_PER_TOKEN, 2_000)
    assert expected < IPHONE_17_PRO.predicted_tok_s(BYTES_PER_TOKEN) * 0.8
    for prompt in result.prompts:
        assert prompt.decode_tok_s == pytest.approx(expected, rel=1e-9)
    assert "calibration 7" in result.timing_model and "2,000" in result.timing_model

    # A profile for another class is refused, not used.
    other = assignment.model_copy(update={"device_profile": IPHONE_16_PRO, "run_id": 42})
    driver.assign(driver.discover()[0], other)
    with pytest.raises(DriverError, match="profile is for iphone-16-pro"):
        run_on_device(driver, driver.discover()[0], artifact, build_job(other), Cancellation(), 60)


def test_iphone_17_pro_is_faster_than_16_pro_by_the_profile_ratio(
    tmp_path: Path, artifact: Path
) -> None:
    fast = simulate(tmp_path / "a", artifact, "iphone-17-pro", udid="sim-a", noise_scale=0)
    slow = simulate(tmp_path / "b", artifact, "iphone-16-pro", udid="sim-b", noise_scale=0)

    ratio = aggregate_tok_s(fast) / aggregate_tok_s(slow)
    profile_ratio = IPHONE_17_PRO.effective_bandwidth_mb_s / IPHONE_16_PRO.effective_bandwidth_mb_s
    assert ratio == pytest.approx(profile_ratio, rel=1e-9)
    assert (
        ratio > 1.2
    )  # docs/device-profiles.md: the 16 Pro profile runs the same build about 21% slower


def test_prefill_processes_tokens_faster_by_the_stated_parallelism(
    tmp_path: Path, artifact: Path
) -> None:
    result = simulate(tmp_path, artifact, noise_scale=0)
    parallelism = TimingParameters().prefill_parallelism

    for prompt in result.prompts:
        assert prompt.prefill_tok_s / prompt.decode_tok_s == pytest.approx(parallelism)
        prefill_ms = prompt.prompt_tokens / prompt.prefill_tok_s * 1000
        assert prompt.ttft_ms == pytest.approx(prefill_ms + prompt.token_latencies_ms[0])


def test_longer_prompts_take_longer_to_first_token(tmp_path: Path, artifact: Path) -> None:
    prompts = sorted(simulate(tmp_path, artifact).prompts, key=lambda p: p.prompt_tokens)

    assert prompts[-1].ttft_ms > 5 * prompts[0].ttft_ms


def test_load_time_and_memory_follow_the_package_size(tmp_path: Path, artifact: Path) -> None:
    result = simulate(tmp_path, artifact)
    timing = TimingParameters()
    package_bytes = sum(
        path.stat().st_size
        for path in (tmp_path / "build" / "decoder.mlpackage").rglob("*")
        if path.is_file()
    )

    assert result.load_time_cold_ms == pytest.approx(
        timing.cold_load_fixed_ms + package_bytes / timing.cold_load_bytes_s * 1000
    )
    assert result.load_time_warm_ms == pytest.approx(
        timing.warm_load_fixed_ms + package_bytes / timing.warm_load_bytes_s * 1000
    )
    assert result.peak_memory_bytes == package_bytes + timing.runtime_overhead_bytes


# Honest labelling and the result schema


def test_results_validate_and_say_they_are_simulated(tmp_path: Path, artifact: Path) -> None:
    result = simulate(tmp_path, artifact, prompts=30, decode_tokens=16)

    reloaded = RunResult.model_validate(json.loads(result.model_dump_json()))
    assert reloaded == result
    assert result.simulated is True
    assert result.driver == "simulated"
    assert result.device_udid == "sim-test-0"
    assert result.product_type == IPHONE_17_PRO.product_types[0]
    assert f"{BYTES_PER_TOKEN:,} B" in result.timing_model
    assert "55,900.0 MB/s" in result.timing_model
    assert "no model executed" in result.timing_model
    assert [p.prompt_index for p in result.prompts] == list(range(30))
    for prompt, source in zip(result.prompts, builtin_prompts(30), strict=True):
        assert prompt.generated_tokens == 16
        assert len(prompt.token_latencies_ms) == 16
        assert prompt.token_ids is None
        assert prompt.prompt_tokens == source.token_count


def test_discovered_devices_are_labelled_simulated(tmp_path: Path) -> None:
    driver = SimulatedDriver(
        [SimulatedDevice("sim-a", "iphone-16-pro"), SimulatedDevice("sim-b", "iphone-17-pro")],
        tmp_path,
    )

    devices = driver.discover()

    assert [(d.udid, d.device_class, d.product_type) for d in devices] == [
        ("sim-a", "iphone-16-pro", "iPhone17,1"),
        ("sim-b", "iphone-17-pro", "iPhone18,1"),
    ]
    assert all(d.simulated and d.driver == "simulated" for d in devices)


def test_unknown_device_class_is_refused_at_start_up(tmp_path: Path) -> None:
    with pytest.raises(UnknownDeviceClass, match="iphone-3g"):
        SimulatedDriver([SimulatedDevice("sim-x", "iphone-3g")], tmp_path)


# Determinism


def test_same_run_on_same_device_reproduces_exactly(tmp_path: Path, artifact: Path) -> None:
    first = simulate(tmp_path / "a", artifact)
    second = simulate(tmp_path / "b", artifact)

    assert first == second


def test_another_run_or_device_draws_different_jitter(tmp_path: Path, artifact: Path) -> None:
    base = simulate(tmp_path / "a", artifact)
    other_run = simulate(tmp_path / "b", artifact, run_id=42)
    other_device = simulate(tmp_path / "c", artifact, udid="sim-test-1")

    latencies = base.prompts[0].token_latencies_ms
    assert other_run.prompts[0].token_latencies_ms != latencies
    assert other_device.prompts[0].token_latencies_ms != latencies
    assert base.prompts[0].token_latencies_ms != base.prompts[1].token_latencies_ms


# Artifacts


def test_a_zip_of_the_package_contents_is_accepted_too(tmp_path: Path) -> None:
    package = write_package(tmp_path / "build")
    flat = content_addressed(zip_directory(package, tmp_path / "flat.zip", keep_top=False))

    result = simulate(tmp_path, flat)

    assert result.simulated


def test_non_zip_artifact_fails_with_a_clear_reason(tmp_path: Path) -> None:
    bogus = artifact_of_bytes(tmp_path, b"<html>502 Bad Gateway</html>")

    with pytest.raises(ArtifactError, match="is not a zip archive"):
        simulate(tmp_path, bogus)


def test_artifact_without_manifest_fails_with_a_clear_reason(tmp_path: Path) -> None:
    package = write_package(tmp_path / "build")
    (package / "Manifest.json").unlink()
    artifact = content_addressed(zip_directory(package, tmp_path / "a.zip"))

    with pytest.raises(ArtifactError, match=r"contains no Manifest\.json"):
        simulate(tmp_path, artifact)


def test_truncated_artifact_fails_with_a_clear_reason(tmp_path: Path, artifact: Path) -> None:
    data = artifact.read_bytes()
    truncated = artifact_of_bytes(tmp_path, data[: len(data) // 2])

    with pytest.raises(ArtifactError, match="not a zip archive|damaged"):
        simulate(tmp_path, truncated)


def test_flipped_byte_in_the_weights_fails_the_checksum(tmp_path: Path, artifact: Path) -> None:
    data = bytearray(artifact.read_bytes())
    offset = bytes(data).index(bytes(range(256))) + 100  # inside weight.bin, stored uncompressed
    data[offset] ^= 0xFF
    damaged = artifact_of_bytes(tmp_path, bytes(data))

    with pytest.raises(ArtifactError, match=r"damaged: checksum mismatch in .*weight\.bin"):
        simulate(tmp_path, damaged)


def test_manifest_naming_a_missing_item_fails(tmp_path: Path) -> None:
    package = write_package(tmp_path / "build")
    (package / "Data" / "com.apple.CoreML" / "weights" / "weight.bin").unlink()
    (package / "Data" / "com.apple.CoreML" / "weights").rmdir()
    artifact = content_addressed(zip_directory(package, tmp_path / "a.zip"))

    with pytest.raises(ArtifactError, match=r"lists com\.apple\.CoreML/weights but the package"):
        simulate(tmp_path, artifact)


def test_unreadable_manifest_fails(tmp_path: Path) -> None:
    package = write_package(tmp_path / "build")
    (package / "Manifest.json").write_text("{not json")
    artifact = content_addressed(zip_directory(package, tmp_path / "a.zip"))

    with pytest.raises(ArtifactError, match="Manifest.json of decoder.mlpackage is unreadable"):
        simulate(tmp_path, artifact)


def test_member_paths_escaping_the_destination_are_refused(tmp_path: Path) -> None:
    evil = tmp_path / "evil.zip"
    with zipfile.ZipFile(evil, "w") as archive:
        archive.writestr("decoder.mlpackage/Manifest.json", manifest({}))
        archive.writestr("../outside.txt", "gotcha")

    with pytest.raises(ArtifactError, match="unsafe member path"):
        unpack_mlpackage(evil, tmp_path / "out")
    assert not (tmp_path / "outside.txt").exists()


def test_two_packages_in_one_artifact_are_refused(tmp_path: Path) -> None:
    double = tmp_path / "double.zip"
    with zipfile.ZipFile(double, "w") as archive:
        archive.writestr("a.mlpackage/Manifest.json", manifest({}))
        archive.writestr("b.mlpackage/Manifest.json", manifest({}))

    with pytest.raises(ArtifactError, match="more than one package"):
        unpack_mlpackage(double, tmp_path / "out")


def test_artifact_failures_are_reported_as_not_retryable(tmp_path: Path) -> None:
    bogus = artifact_of_bytes(tmp_path, b"not a zip")
    with pytest.raises(ArtifactError) as caught:
        simulate(tmp_path, bogus)

    reason, retryable = failure_reason(caught.value, "running on sim-test-0")

    assert reason.startswith("unusable artifact: artifact ")
    assert "not a zip archive" in reason
    assert retryable is False


def test_the_artifact_cache_downloads_each_artifact_once(tmp_path: Path, artifact: Path) -> None:
    downloads: list[str] = []

    def download(sha256: str, destination: Path) -> Path:
        downloads.append(sha256)
        destination.write_bytes(artifact.read_bytes())
        return destination

    cache = ArtifactCache(tmp_path / "cache", download)
    paths = [cache.fetch(artifact.stem) for _ in range(3)]

    assert downloads == [artifact.stem]
    assert paths[0] == tmp_path / "cache" / f"{artifact.stem}.zip"
    assert paths[0].read_bytes() == artifact.read_bytes()


def test_concurrent_device_threads_share_one_download(tmp_path: Path, artifact: Path) -> None:
    downloads: list[str] = []

    def slow_download(sha256: str, destination: Path) -> Path:
        downloads.append(sha256)
        time.sleep(0.2)
        destination.write_bytes(artifact.read_bytes())
        return destination

    cache = ArtifactCache(tmp_path / "cache", slow_download)
    threads = [threading.Thread(target=cache.fetch, args=(artifact.stem,)) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert downloads == [artifact.stem]


def test_a_cached_file_that_no_longer_matches_its_digest_is_fetched_again(
    tmp_path: Path, artifact: Path
) -> None:
    cached = tmp_path / "cache" / f"{artifact.stem}.zip"
    cached.parent.mkdir()
    cached.write_bytes(b"edited by hand")
    downloads: list[str] = []

    def download(sha256: str, destination: Path) -> Path:
        downloads.append(sha256)
        destination.write_bytes(artifact.read_bytes())
        return destination

    ArtifactCache(tmp_path / "cache", download).fetch(artifact.stem)

    assert downloads == [artifact.stem]
    assert cached.read_bytes() == artifact.read_bytes()


def test_cache_refuses_addresses_that_are_not_sha256(tmp_path: Path) -> None:
    cache = ArtifactCache(tmp_path, lambda sha256, destination: destination)

    with pytest.raises(ArtifactError, match="not a lowercase sha256"):
        cache.fetch("../../etc/passwd")


# Jobs, results and cancellation


def test_prompts_are_left_truncated_to_fit_the_context(artifact: Path) -> None:
    job = build_job(assignment_for(artifact, context=64, decode_tokens=32))
    full = builtin_prompts(30)[3].token_ids(102400)

    assert max(len(prompt.token_ids) for prompt in job.prompts) == 32
    assert job.prompts[3].token_ids == full[-32:]
    assert len(job.prompts[0].token_ids) == builtin_prompts(1)[0].token_count


def test_a_token_budget_that_fills_the_context_is_refused(artifact: Path) -> None:
    with pytest.raises(JobError, match="leaves no room for a prompt in a 64-token context"):
        build_job(assignment_for(artifact, context=64, decode_tokens=64))


def test_results_for_another_job_are_rejected(tmp_path: Path, artifact: Path) -> None:
    result = simulate(tmp_path, artifact, prompts=5, decode_tokens=8)
    device = DeviceInfo(
        udid="sim-test-0",
        device_class="iphone-17-pro",
        product_type="iPhone18,1",
        driver="simulated",
        simulated=True,
    )
    longer = build_job(assignment_for(artifact, prompts=5, decode_tokens=16))
    more_prompts = build_job(assignment_for(artifact, prompts=6, decode_tokens=8))

    check_result(build_job(assignment_for(artifact, prompts=5, decode_tokens=8)), device, result)
    with pytest.raises(ResultMismatch, match="8 tokens generated, the job asked for 16"):
        check_result(longer, device, result)
    with pytest.raises(ResultMismatch, match="answers prompts"):
        check_result(more_prompts, device, result)
    with pytest.raises(ResultMismatch, match="expected iphone-16-pro"):
        check_result(longer, device.model_copy(update={"device_class": "iphone-16-pro"}), result)


def test_shutdown_cancels_a_run_in_flight_with_the_reason(tmp_path: Path, artifact: Path) -> None:
    shutdown = threading.Event()
    timer = threading.Timer(0.2, shutdown.set)
    timer.start()
    started = time.monotonic()

    # 30 prompts x 32 tokens at ~93 tok/s is about 11 s simulated; time_scale 1 would take that.
    with pytest.raises(RunCancelled, match="agent shutting down") as caught:
        simulate(tmp_path, artifact, cancel=Cancellation(shutdown), time_scale=1.0)

    assert time.monotonic() - started < 3
    assert failure_reason(caught.value, "running") == ("agent shutting down", True)
    assert not (tmp_path / "work" / "devices" / "sim-test-0" / "Documents").exists()


def test_time_scale_sleeps_a_fraction_of_the_simulated_time(tmp_path: Path, artifact: Path) -> None:
    started = time.monotonic()
    result = simulate(tmp_path, artifact, prompts=2, decode_tokens=8, time_scale=1.0)
    elapsed_s = time.monotonic() - started

    simulated_s = (
        result.load_time_cold_ms
        + sum(
            p.prompt_tokens / p.prefill_tok_s * 1000 + sum(p.token_latencies_ms)
            for p in result.prompts
        )
    ) / 1000
    assert simulated_s <= elapsed_s < simulated_s + 2


def test_a_job_without_bytes_per_token_fails_clearly(artifact: Path) -> None:
    job = build_job(assignment_for(artifact)).model_copy(update={"bytes_per_token": 0})

    with pytest.raises(DriverError, match="bytes_per_token is 0"):
        simulate_run(job, SimulatedDevice("sim-a", "iphone-17-pro"), package_bytes=1)


def test_device_errors_carry_the_device_log(tmp_path: Path, artifact: Path) -> None:
    driver = SimulatedDriver([SimulatedDevice("sim-a", "iphone-17-pro")], tmp_path)
    job: HarnessJob = build_job(assignment_for(artifact)).model_copy(
        update={"artifact_sha256": "0" * 64}
    )

    with pytest.raises(DriverError, match="not installed") as caught:
        run_on_device(driver, driver.discover()[0], artifact, job, Cancellation(), timeout_s=60)

    reason, retryable = failure_reason(caught.value, "running on sim-a")
    assert "installed decoder.mlpackage" in reason
    assert "device log:" in reason
    assert retryable


# Configuration and start-up


def test_simulated_udids_are_stable_distinct_and_marked() -> None:
    settings = AgentSettings(
        token="t", name="lab-1", simulated=("iphone-16-pro", "iphone-17-pro", "iphone-17-pro")
    )

    udids = [device.udid for device in settings.simulated_devices()]

    assert udids == [device.udid for device in settings.simulated_devices()]
    assert len(set(udids)) == 3
    assert all(udid.startswith("sim-") for udid in udids)
    assert udids[0] == simulated_udid("lab-1", 0, "iphone-16-pro")
    assert simulated_udid("lab-2", 0, "iphone-16-pro") != udids[0]


def test_settings_come_from_the_environment_and_flags_override() -> None:
    environ = {
        "DECODEBENCH_SERVER_URL": "http://server:9000",
        "DECODEBENCH_AGENT_TOKEN": "secret",
        "DECODEBENCH_AGENT_NAME": "lab-7",
        "DECODEBENCH_AGENT_SIMULATED": "iphone-16-pro, iphone-17-pro",
        "DECODEBENCH_AGENT_POLL_INTERVAL_S": "0.5",
    }

    settings = parse_settings(["--poll-interval", "0.25", "--once"], environ)

    assert settings.server_url == "http://server:9000"
    assert settings.api_token == "secret"
    assert settings.name == "lab-7"
    assert settings.simulated == ("iphone-16-pro", "iphone-17-pro")
    assert settings.poll_interval_s == 0.25
    assert settings.once is True
    assert "secret" not in repr(settings)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--simulated", "iphone-17-pro"], "agent token is required"),
        (["--token", "t"], "no devices"),
        (["--token", "t", "--simulated", "pixel-9"], "unknown device class 'pixel-9'"),
        (["--token", "t", "--simulated", "iphone-17-pro", "--poll-interval", "0"], "poll_interval"),
    ],
)
def test_bad_settings_exit_with_a_message(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as caught:
        parse_settings(argv, {})

    assert caught.value.code == 2
    assert message in capsys.readouterr().err


def unreachable_client() -> DecodebenchClient:
    # Port 9 (discard) on localhost: nothing listens, so connections are refused at once.
    return DecodebenchClient("http://127.0.0.1:9", token="t", timeout=2)


def test_registration_backs_off_then_gives_up_when_the_server_is_unreachable(
    caplog: pytest.LogCaptureFixture,
) -> None:
    registration = AgentRegistration(name="lab-1")
    started = time.monotonic()

    with unreachable_client() as client, pytest.raises(ServerUnreachable, match="unreachable"):
        register_with_backoff(
            client, registration, threading.Event(), give_up_after_s=1.0, first_delay_s=0.1
        )

    # Delays 0.1, 0.2, 0.4: three logged failures, then giving up before exceeding 1 s.
    failures = [r for r in caplog.records if "registration attempt" in r.getMessage()]
    assert [r.getMessage().split()[2] for r in failures] == ["1", "2", "3"]
    assert time.monotonic() - started < 1.5


def test_registration_stops_waiting_when_asked_to(caplog: pytest.LogCaptureFixture) -> None:
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()

    with unreachable_client() as client:
        registered = register_with_backoff(client, AgentRegistration(name="lab-1"), stop)

    assert registered is None


def test_a_refusal_is_not_retried() -> None:
    # A refusal needs a live server answering 4xx (the end-to-end test); this checks the
    # classification the back-off loop relies on.
    assert not is_transient(ApiError(401, "bad token"))
    assert not is_transient(ApiError(422, "bad inventory"))
    assert is_transient(ApiError(503, "starting"))
    assert issubclass(RegistrationRefused, Exception)


def test_the_agent_exits_when_the_server_stays_unreachable(tmp_path: Path) -> None:
    settings = AgentSettings(
        token="t",
        name="lab-1",
        simulated=("iphone-17-pro",),
        work_dir=tmp_path,
        max_idle_seconds=0.5,
    )
    driver = SimulatedDriver(settings.simulated_devices(), tmp_path)

    with unreachable_client() as client:
        assert Agent(settings, client, driver).run() == 1
