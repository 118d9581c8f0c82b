"""The agent's pymobiledevice3 driver against emulated iPhones, the real client code path:
harness install, push of a real tiny-gqa build, launch, pull, the profile the run is timed
with, and the tokens the phone answers.

Launching is DVT process control through pymobiledevice3's own client: on these iOS 18/26
phones through the emulated tunneld and RemoteServiceDiscovery (tests/emulator/test_dvt.py covers
the iOS 16 lockdown path, the developer disk image and the DVT faults).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from agent.drivers.base import Cancellation, DriverError, run_on_device
from agent.drivers.emulated import EmulatedDriver
from agent.runner import build_job
from decodebench.contracts.profiles import IPHONE_17_PRO
from decodebench.harness import HARNESS_BUNDLE_ID, JOB_FILE, model_dir
from decodebench.timing import TimingParameters
from emulator.fleet import EmulatedFleet
from emulator.ipa import make_harness_ipa
from tests.support.emulated import CONTEXT, Build, assignment, files_of, run

pytestmark = pytest.mark.slow  # converts real tiny-gqa builds with coremltools


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
