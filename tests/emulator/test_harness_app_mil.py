"""The emulated harness runs what was built, through the agent's real pymobiledevice3 path.

Real tiny-gqa builds (coremltools) with the KV cache as state and as input: by default the
emulated app takes its token ids from the pushed package run by the MIL interpreter, for both
layouts, and they are the fp32 reference decoder's greedy tokens. The agent accepts a harness
signed under another bundle id when configured for it, an interruption fails the run with its
reason, and a job lost before launch ends the wait at once (a done marker, not a timeout).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from agent.config import parse_settings
from agent.drivers.base import Cancellation, DriverError, run_on_device
from agent.drivers.emulated import EmulatedDriver, driver_for_fleet
from agent.runner import build_job, check_result
from decodebench.artifacts import pack_directory
from decodebench.contracts.domain import VariantSpec
from decodebench.contracts.protocol import DeviceInfo
from decodebench.contracts.results import RunResult
from decodebench.harness import (
    DONE_MARKER,
    HARNESS_BUNDLE_ID,
    JOB_FILE,
    DoneMarker,
    FailureReason,
)
from emulator.fleet import EmulatedFleet
from emulator.ipa import make_harness_ipa
from tests.support.emulated import assignment as support_assignment

pytestmark = pytest.mark.slow  # converts real tiny-gqa builds with coremltools

CONTEXT = 64
LAB_BUNDLE_ID = "org.example.lab.decodebench-harness"


@dataclass(frozen=True)
class Build:
    variant: VariantSpec
    artifact: Path
    bytes_per_token: int


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Build]:
    from decodebench.building.build import build_variant

    root = tmp_path_factory.mktemp("builds")
    built = {}
    for kv in ("state", "input"):
        variant = VariantSpec.model_validate({"attention": "folded", "kv": kv, "context": CONTEXT})
        report = build_variant("tiny-gqa", variant, root / kv)
        archive = pack_directory(root / kv, root / f"{kv}.zip")
        sha256 = hashlib.sha256(archive.read_bytes()).hexdigest()
        built[kv] = Build(
            variant,
            archive.rename(root / f"{sha256}.zip"),
            report.analysis.bytes_per_token.total,
        )
    return built


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[EmulatedFleet]:
    running = EmulatedFleet(tmp_path / "devices", reattach_after_s=None)  # tokens: auto
    running.start()
    yield running
    running.stop()


@pytest.fixture
def drivers() -> Iterator[list[EmulatedDriver]]:
    made: list[EmulatedDriver] = []
    yield made
    for driver in made:
        driver.close()


def driver(
    fleet: EmulatedFleet, tmp_path: Path, made: list[EmulatedDriver], **options: object
) -> EmulatedDriver:
    made.append(
        driver_for_fleet(
            fleet, tmp_path / "agent", poll_interval_s=0.02, owns_fleet=False, **options
        )
    )
    return made[-1]


def run(
    driver: EmulatedDriver, device: DeviceInfo, build: Build, prompts: int = 1, tokens: int = 3
) -> RunResult:
    assignment = support_assignment(build, device, run_id=9, prompts=prompts, tokens=tokens)
    job = build_job(assignment, device)
    # short prompts: every step goes through the interpreter
    job = job.model_copy(
        update={
            "prompts": [p.model_copy(update={"token_ids": p.token_ids[:6]}) for p in job.prompts]
        }
    )
    result = run_on_device(driver, device, build.artifact, job, Cancellation(), timeout_s=120)
    check_result(job, device, result)
    return result


@pytest.mark.parametrize("kv", ["state", "input"])
def test_token_ids_come_from_the_pushed_package_by_default(
    kv: str,
    builds: dict[str, Build],
    fleet: EmulatedFleet,
    tmp_path: Path,
    drivers: list[EmulatedDriver],
) -> None:
    from decodebench.contracts.presets import TINY_GQA
    from decodebench.modeling import build_model, greedy_decode
    from decodebench.prompts import builtin_prompts

    fleet.add("iphone-17-pro")
    emulated = driver(fleet, tmp_path, drivers)

    result = run(emulated, emulated.discover()[0], builds[kv])

    prompt = builtin_prompts(1)[0].token_ids(TINY_GQA.vocab_size)[-(CONTEXT - 3) :][:6]
    reference = build_model(TINY_GQA, CONTEXT, "folded", kv=kv)  # fp32, the build's weights
    expected, _ = greedy_decode(reference, prompt, 3)
    assert result.prompts[0].token_ids == expected
    assert "the pushed package run by the MIL reference interpreter" in result.timing_model


def test_the_agent_drives_a_harness_signed_under_another_bundle_id(
    builds: dict[str, Build], fleet: EmulatedFleet, tmp_path: Path, drivers: list[EmulatedDriver]
) -> None:
    phone = fleet.add("iphone-16-pro", tokens="off")
    ipa = make_harness_ipa(tmp_path / "lab.ipa", bundle_id=LAB_BUNDLE_ID)
    settings = parse_settings(
        ["--token", "t", "--driver", "pymobiledevice3", "--harness-bundle-id", LAB_BUNDLE_ID], {}
    )
    emulated = driver(
        fleet, tmp_path, drivers, harness_ipa=ipa, bundle_id=settings.harness_bundle_id
    )

    result = run(emulated, emulated.discover()[0], builds["state"])

    assert list(phone.apps) == [LAB_BUNDLE_ID]
    assert result.prompts[0].token_ids is None  # tokens off on this phone
    with pytest.raises(DriverError, match=f"is {LAB_BUNDLE_ID}, not the harness dev.decodebench"):
        driver(fleet, tmp_path / "other", drivers, harness_ipa=ipa)


def test_an_interrupted_run_fails_with_its_reason(
    builds: dict[str, Build], fleet: EmulatedFleet, tmp_path: Path, drivers: list[EmulatedDriver]
) -> None:
    fleet.add("iphone-17-pro", ["interrupt"], tokens="off")
    emulated = driver(fleet, tmp_path, drivers)

    with pytest.raises(DriverError, match="the harness failed: interrupted: the app left"):
        run(emulated, emulated.discover()[0], builds["state"], prompts=3)


def test_a_job_gone_before_launch_fails_at_once_instead_of_at_the_timeout(
    builds: dict[str, Build], fleet: EmulatedFleet, tmp_path: Path, drivers: list[EmulatedDriver]
) -> None:
    phone = fleet.add("iphone-17-pro", tokens="off")
    emulated = driver(fleet, tmp_path, drivers)
    device = emulated.discover()[0]
    build = builds["state"]
    job = build_job(
        support_assignment(build, device, run_id=12, prompts=1, tokens=2),
        device,
    )
    emulated.prepare(device)
    emulated.install(device, build.artifact)
    emulated.push(device, job)
    (phone.documents(HARNESS_BUNDLE_ID) / JOB_FILE).unlink()  # lost between push and launch
    started = time.monotonic()

    emulated.launch(device, job)
    emulated.wait(device, job, 60, Cancellation())  # returns on the done marker

    assert time.monotonic() - started < 10
    marker = DoneMarker.model_validate_json(
        (phone.documents(HARNESS_BUNDLE_ID) / DONE_MARKER).read_text()
    )
    assert (marker.ok, marker.reason) == (False, FailureReason.missing_job)
    with pytest.raises(DriverError):
        emulated.pull_results(device, job)
    emulated.cleanup(device, job)
