"""The agent's pymobiledevice3 driver against emulated iPhones, the real client code path:
every injected fault during a run, with the failure reason (and device status) a lab
engineer needs.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from agent.drivers.base import Cancellation, DriverError, RunCancelled, run_on_device
from agent.drivers.emulated import EmulatedDriver
from agent.runner import build_job
from decodebench.harness import HARNESS_BUNDLE_ID, model_dir
from emulator.fleet import EmulatedFleet
from tests.support.emulated import Build, assignment, files_of, run, wait_until

pytestmark = pytest.mark.slow  # converts real tiny-gqa builds with coremltools


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
