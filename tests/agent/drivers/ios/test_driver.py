"""The agent's pymobiledevice3 driver against emulated iPhones: the real client code path.

Discovery, identity, harness install, push of a real tiny-gqa build, launch, pull, attach and
detach, and every injected fault with the failure reason (and device status) it must produce.
Launching is DVT process control through pymobiledevice3's own client: on these iOS 18/26
phones through the emulated tunneld and RemoteServiceDiscovery (tests/emulator/test_dvt.py covers
the iOS 16 lockdown path, the developer disk image and the DVT faults).
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from agent.drivers.base import Cancellation, DriverError, RunCancelled, run_on_device
from agent.drivers.emulated import EmulatedDriver, driver_for_fleet
from agent.runner import build_job, check_result
from decodebench.artifacts import pack_directory
from decodebench.contracts.domain import VariantSpec
from decodebench.contracts.profiles import IPHONE_17_PRO
from decodebench.contracts.protocol import DeviceInfo, RunAssignment
from decodebench.contracts.results import RunResult
from decodebench.harness import HARNESS_BUNDLE_ID, JOB_FILE, model_dir
from decodebench.timing import TimingParameters
from emulator.fleet import EmulatedFleet
from emulator.ipa import make_harness_ipa

pytestmark = pytest.mark.slow  # converts real tiny-gqa builds with coremltools

CONTEXT = 128


@dataclass(frozen=True)
class Build:
    variant: VariantSpec
    artifact: Path
    package: Path
    bytes_per_token: int


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Build]:
    """Real tiny-gqa builds (coremltools), both attention layouts, zipped as the worker does."""
    from decodebench.building.build import build_variant

    root = tmp_path_factory.mktemp("builds")
    built = {}
    for attention in ("repeat_kv", "folded"):
        variant = VariantSpec(attention=attention, context=CONTEXT)
        out = root / attention
        report = build_variant("tiny-gqa", variant, out)
        archive = pack_directory(out, root / f"{attention}.zip")
        sha256 = hashlib.sha256(archive.read_bytes()).hexdigest()
        built[attention] = Build(
            variant,
            archive.rename(root / f"{sha256}.zip"),
            out / "model.mlpackage",
            report.analysis.bytes_per_token.total,
        )
    return built


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[EmulatedFleet]:
    running = EmulatedFleet(tmp_path / "devices", tokens="off", reattach_after_s=None)
    running.start()
    yield running
    running.stop()


@pytest.fixture
def make_driver(fleet: EmulatedFleet, tmp_path: Path) -> Iterator[Callable[..., EmulatedDriver]]:
    drivers: list[EmulatedDriver] = []

    def make(**options: object) -> EmulatedDriver:
        driver = driver_for_fleet(
            fleet, tmp_path / "agent", poll_interval_s=0.02, owns_fleet=False, **options
        )
        drivers.append(driver)
        return driver

    yield make
    for driver in drivers:
        driver.close()


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.02)


def assignment(
    build: Build, device: DeviceInfo, run_id: int = 11, prompts: int = 3, tokens: int = 4
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


# Discovery and a whole run


def test_devices_are_discovered_with_their_lockdown_identity(
    fleet: EmulatedFleet, make_driver: Callable[..., EmulatedDriver]
) -> None:
    sixteen, seventeen = fleet.add("iphone-16-pro"), fleet.add("iphone-17-pro")

    devices = {device.udid: device for device in make_driver().discover()}

    assert set(devices) == {sixteen.udid, seventeen.udid}
    assert devices[seventeen.udid].product_type == "iPhone18,1"
    assert devices[seventeen.udid].device_class == "iphone-17-pro"
    assert devices[seventeen.udid].os_version == seventeen.identity.product_version
    assert devices[sixteen.udid].device_class == "iphone-16-pro"
    assert all(device.driver == "emulated" and device.simulated for device in devices.values())


def test_a_run_installs_pushes_launches_and_pulls(
    fleet: EmulatedFleet, make_driver: Callable[..., EmulatedDriver], builds: dict[str, Build]
) -> None:
    phone = fleet.add("iphone-17-pro", timing=TimingParameters(noise_scale=0))  # bare roofline
    driver = make_driver()
    device = driver.discover()[0]
    build = builds["folded"]

    result = run(driver, device, build, prompts=3, tokens=4)

    assert result.driver == "emulated" and result.simulated is True
    assert result.device_udid == phone.udid and result.product_type == "iPhone18,1"
    assert result.os_version == phone.identity.product_version
    assert HARNESS_BUNDLE_ID in phone.apps
    documents = phone.documents(HARNESS_BUNDLE_ID)
    pushed = documents / model_dir(build.artifact.stem) / "model.mlpackage"
    assert files_of(pushed) == files_of(build.package)  # byte for byte, through AFC
    job = json.loads((documents / JOB_FILE).read_text())
    assert job["device_udid"] == phone.udid and job["package_path"].endswith("model.mlpackage")
    roofline_ms = 1000 / IPHONE_17_PRO.predicted_tok_s(build.bytes_per_token)
    for prompt in result.prompts:
        assert all(
            0.96 * roofline_ms <= ms <= 1.04 * roofline_ms for ms in prompt.token_latencies_ms
        )
        assert prompt.ttft_ms == pytest.approx(prompt.prompt_tokens * roofline_ms, rel=0.04)
    assert "no Core ML executed" in result.timing_model


def test_the_emulated_phone_times_with_the_profile_the_assignment_carries(
    fleet: EmulatedFleet, make_driver: Callable[..., EmulatedDriver], builds: dict[str, Build]
) -> None:
    """The server's current profile (here a calibrated one at half the built-in bandwidth, with
    a per-op overhead) and the build's dispatched ops reach the emulated phone's clock."""
    fleet.add("iphone-17-pro", timing=TimingParameters(noise_scale=0))
    driver = make_driver()
    device = driver.discover()[0]
    build = builds["folded"]
    calibrated = IPHONE_17_PRO.model_copy(
        update={"effective_bandwidth_mb_s": IPHONE_17_PRO.effective_bandwidth_mb_s / 2,
                "dispatch_overhead_us": 3.0, "source": "calibration 9",
                "calibrated_parameters": ("effective_bandwidth_mb_s", "dispatch_overhead_us")}
    )  # fmt: skip
    sent = assignment(build, device, prompts=1).model_copy(
        update={"device_profile": calibrated, "dispatch_ops": 500}
    )
    driver.assign(device, sent)
    job = build_job(sent, device)
    result = run_on_device(driver, device, build.artifact, job, Cancellation(), timeout_s=60)
    expected_ms = 1000 * calibrated.seconds_per_token(build.bytes_per_token, 500)
    assert expected_ms > 2 * 1000 / IPHONE_17_PRO.predicted_tok_s(build.bytes_per_token)
    for prompt in result.prompts:
        assert all(
            0.96 * expected_ms <= ms <= 1.04 * expected_ms for ms in prompt.token_latencies_ms
        )
    assert "calibration 9" in result.timing_model and "500" in result.timing_model


def test_a_pushed_model_is_reused_and_old_ones_are_evicted(
    fleet: EmulatedFleet, make_driver: Callable[..., EmulatedDriver], builds: dict[str, Build]
) -> None:
    phone = fleet.add("iphone-17-pro")
    driver = make_driver(models_kept=1)
    device = driver.discover()[0]
    models = phone.documents(HARNESS_BUNDLE_ID) / "models"
    folded, repeat_kv = builds["folded"], builds["repeat_kv"]

    run(driver, device, folded, run_id=1)
    weights = next((models / folded.artifact.stem).rglob("weight.bin"))
    pushed_at = weights.stat().st_mtime_ns
    run(driver, device, folded, run_id=2)
    assert weights.stat().st_mtime_ns == pushed_at  # not pushed again

    run(driver, device, repeat_kv, run_id=3)
    assert sorted(path.name for path in models.iterdir()) == [repeat_kv.artifact.stem]


def test_reference_tokens_agree_across_layouts_and_with_torch(
    fleet: EmulatedFleet, make_driver: Callable[..., EmulatedDriver], builds: dict[str, Build]
) -> None:
    from decodebench.contracts.presets import TINY_GQA
    from decodebench.modeling import build_model, greedy_decode
    from decodebench.prompts import builtin_prompts

    fleet.add("iphone-17-pro", tokens="torch")
    driver = make_driver()
    device = driver.discover()[0]

    slow = run(driver, device, builds["repeat_kv"], run_id=1, prompts=2, tokens=6)
    fast = run(driver, device, builds["folded"], run_id=2, prompts=2, tokens=6)

    assert [p.token_ids for p in slow.prompts] == [p.token_ids for p in fast.prompts]
    prompt = builtin_prompts(1)[0].token_ids(TINY_GQA.vocab_size)
    expected, _ = greedy_decode(build_model(TINY_GQA, CONTEXT, "folded"), prompt, 6)
    assert fast.prompts[0].token_ids == expected
    assert "PyTorch reference decoder" in fast.timing_model


def test_mil_tokens_come_from_the_pushed_package_itself(
    fleet: EmulatedFleet, make_driver: Callable[..., EmulatedDriver], builds: dict[str, Build]
) -> None:
    from decodebench.contracts.presets import TINY_GQA
    from decodebench.modeling import build_model, greedy_decode
    from decodebench.prompts import builtin_prompts

    fleet.add("iphone-17-pro", tokens="mil")
    driver = make_driver()

    result = run(driver, driver.discover()[0], builds["repeat_kv"], prompts=1, tokens=3)

    prompt = builtin_prompts(1)[0].token_ids(TINY_GQA.vocab_size)
    expected, _ = greedy_decode(build_model(TINY_GQA, CONTEXT, "repeat_kv"), prompt, 3)
    assert result.prompts[0].token_ids == expected
    assert "the pushed package run by the MIL reference interpreter" in result.timing_model


def test_attach_and_detach_are_followed_live(
    fleet: EmulatedFleet, make_driver: Callable[..., EmulatedDriver]
) -> None:
    first = fleet.add("iphone-17-pro")
    driver = make_driver()
    assert [device.udid for device in driver.discover()] == [first.udid]

    second = fleet.add("iphone-16-pro")
    wait_until(lambda: len(driver.discover()) == 2, "the new device is discovered")
    fleet.usbmuxd.detach(first.udid)
    wait_until(
        lambda: [d.udid for d in driver.discover()] == [second.udid], "the unplugged one is gone"
    )
    fleet.usbmuxd.attach(first.udid)
    wait_until(lambda: len(driver.discover()) == 2, "it is back")


# Faults: each with the reason a lab engineer needs


def test_a_cable_pulled_mid_push_fails_the_run_and_a_later_run_repushes(
    fleet: EmulatedFleet, make_driver: Callable[..., EmulatedDriver], builds: dict[str, Build]
) -> None:
    phone = fleet.add("iphone-17-pro", ["disconnect-mid-push"])
    driver = make_driver()
    device = driver.discover()[0]
    build = builds["folded"]

    with pytest.raises(DriverError) as caught:
        run(driver, device, build)

    assert "was disconnected while pushing the model" in str(caught.value)
    assert caught.value.device_status == "disconnected"
    model = phone.documents(HARNESS_BUNDLE_ID) / model_dir(build.artifact.stem)
    assert not (model / "complete").exists()  # half a package, never taken for a whole one

    fleet.usbmuxd.attach(phone.udid)
    wait_until(lambda: driver.discover() != [], "the device is plugged back in")
    run(driver, driver.discover()[0], build)
    assert files_of(model / "model.mlpackage") == files_of(build.package)


def test_an_app_crash_fails_the_run_with_the_harness_log(
    fleet: EmulatedFleet, make_driver: Callable[..., EmulatedDriver], builds: dict[str, Build]
) -> None:
    fleet.add("iphone-16-pro", ["app-crash"])
    driver = make_driver()

    with pytest.raises(DriverError) as caught:
        run(driver, driver.discover()[0], builds["folded"])

    error = caught.value
    # DVT's termination notice carries the crashing signal; the harness log says the rest.
    assert "the harness exited without finishing the run (crashed (SIGSEGV))" in str(error)
    assert error.device_status is None  # the device itself is fine
    assert "harness.log: " in error.device_log and "fatal error: EXC_BAD_ACCESS" in error.device_log
    assert "syslog: " in error.device_log and "DecodebenchHarness[" in error.device_log
    assert "dvt output: " in error.device_log and "fatal error: EXC_BAD_ACCESS" in error.device_log


def test_a_slow_device_times_out_and_the_harness_is_stopped(
    fleet: EmulatedFleet, make_driver: Callable[..., EmulatedDriver], builds: dict[str, Build]
) -> None:
    phone = fleet.add("iphone-17-pro", ["slow"], slow_s=60)
    driver = make_driver()

    with pytest.raises(DriverError, match="the harness did not finish within 1 s"):
        run(driver, driver.discover()[0], builds["folded"], timeout_s=1)

    assert [process.state for process in phone.processes.values()] == ["killed"]


def test_cancelling_a_run_stops_the_harness(
    fleet: EmulatedFleet, make_driver: Callable[..., EmulatedDriver], builds: dict[str, Build]
) -> None:
    phone = fleet.add("iphone-17-pro", ["slow"], slow_s=60)
    driver = make_driver()
    device = driver.discover()[0]
    job = build_job(assignment(builds["folded"], device), device)
    cancel = Cancellation()

    def cancel_once_launched() -> None:
        wait_until(lambda: any(p.running for p in phone.processes.values()), "the launch")
        cancel.cancel("lease lost")

    canceller = threading.Thread(target=cancel_once_launched)
    canceller.start()
    with pytest.raises(RunCancelled, match="lease lost"):
        run_on_device(driver, device, builds["folded"].artifact, job, cancel, timeout_s=60)
    canceller.join()

    assert [process.state for process in phone.processes.values()] == ["killed"]


def test_a_device_that_locks_during_the_run_is_reported_locked(
    fleet: EmulatedFleet, make_driver: Callable[..., EmulatedDriver], builds: dict[str, Build]
) -> None:
    fleet.add("iphone-17-pro", ["lock-during-run"])
    driver = make_driver()
    device = driver.discover()[0]

    with pytest.raises(DriverError) as caught:
        run(driver, device, builds["folded"])

    assert "refused to launch the harness" in str(caught.value)
    assert "for reason: Locked" in str(caught.value)
    assert caught.value.device_status == "locked"
    assert driver.health(device).status == "locked"


@pytest.mark.parametrize(
    ("spec", "status", "reason"),
    [
        ("locked", "locked", "is not ready: locked"),
        ("developer-mode-off", "developer mode off", "is not ready: developer mode off"),
        ("not-paired", "not paired", "is not ready: not paired"),
    ],
)
def test_device_conditions_show_as_status_and_refuse_runs(
    fleet: EmulatedFleet,
    make_driver: Callable[..., EmulatedDriver],
    builds: dict[str, Build],
    spec: str,
    status: str,
    reason: str,
) -> None:
    fleet.add("iphone-17-pro", [spec])
    driver = make_driver()
    device = driver.discover()[0]

    assert driver.health(device).status == status
    with pytest.raises(DriverError, match=reason) as caught:
        run(driver, device, builds["folded"])
    assert caught.value.device_status == status


def test_battery_and_charging_come_from_lockdown(
    fleet: EmulatedFleet, make_driver: Callable[..., EmulatedDriver]
) -> None:
    fleet.add("iphone-17-pro", ["battery=15", "charging=false"])
    driver = make_driver()

    health = driver.health(driver.discover()[0])

    assert (health.battery_level, health.charging, health.status) == (15, False, "ready")


def test_without_the_harness_and_without_an_ipa_the_reason_says_so(
    fleet: EmulatedFleet, make_driver: Callable[..., EmulatedDriver], builds: dict[str, Build]
) -> None:
    fleet.add("iphone-17-pro")
    driver = make_driver(harness_ipa=None)

    with pytest.raises(DriverError, match="is not installed on device .* no --harness-ipa"):
        run(driver, driver.discover()[0], builds["folded"])


def test_a_newer_harness_ipa_is_installed_over_the_old_one(
    fleet: EmulatedFleet,
    make_driver: Callable[..., EmulatedDriver],
    builds: dict[str, Build],
    tmp_path: Path,
) -> None:
    phone = fleet.add("iphone-17-pro")
    first = make_driver()
    run(first, first.discover()[0], builds["folded"], run_id=1)
    assert phone.apps[HARNESS_BUNDLE_ID].short_version == "1.0"

    newer = make_harness_ipa(tmp_path / "newer.ipa", version="1.1", build="2")
    driver = make_driver(harness_ipa=newer)
    run(driver, driver.discover()[0], builds["folded"], run_id=2)

    assert (phone.apps[HARNESS_BUNDLE_ID].short_version, phone.apps[HARNESS_BUNDLE_ID].version) == (
        "1.1",
        "2",
    )


def test_a_stopped_usbmuxd_leaves_no_device_and_a_clear_status(
    fleet: EmulatedFleet, make_driver: Callable[..., EmulatedDriver]
) -> None:
    fleet.add("iphone-17-pro")
    driver = make_driver()
    device = driver.discover()[0]

    fleet.usbmuxd.stop()

    wait_until(lambda: driver.discover() == [], "the device is gone with usbmuxd")
    assert driver.health(device).status == "disconnected"
