"""The emulated harness app behaves as ios_harness does, by the same definitions.

Run directly on an emulated device (no usbmux): every way a job can be unusable still ends in a
done marker saying why; an interruption abandons the run with reason `interrupted`; memory,
thermal samples and the bounded thermal wait follow `decodebench.harness`; any bundle id that
is the harness launches. Token ids from the pushed package are in test_harness_app_mil.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from decodebench.contracts.domain import VariantSpec
from decodebench.contracts.presets import TINY_GQA
from decodebench.contracts.results import RunResult, ThermalState
from decodebench.harness import (
    COMPLETE_MARKER,
    DONE_MARKER,
    HARNESS_BUNDLE_ID,
    JOB_FILE,
    RESULTS_FILE,
    DoneMarker,
    FailureReason,
    HarnessJob,
    HarnessPrompt,
    package_path,
)
from emulator.app import HarnessLog, LaunchRefused, launch_app, run_harness
from emulator.device import AppRecord, EmulatedDevice
from emulator.faults import Condition
from emulator.fleet import EmulatedFleet

SHA = "cd" * 32
CONTEXT = 128
PACKAGE_BYTES = 1000


@pytest.fixture
def phone(tmp_path: Path) -> EmulatedDevice:
    fleet = EmulatedFleet(tmp_path / "devices", tokens="off")
    return fleet.add("iphone-17-pro")


def make_job(**fields: object) -> dict[str, object]:
    job = HarnessJob(
        run_id=5,
        model="tiny-gqa",
        variant_label="folded",
        device_class="iphone-17-pro",
        artifact_sha256=SHA,
        package_path=package_path(SHA),
        bytes_per_token=2_000_000,
        context_tokens=CONTEXT,
        decode_tokens=4,
        prompt_set_version="builtin-v1",
        variant=VariantSpec(context=CONTEXT),
        prompts=[HarnessPrompt(index=i, token_ids=[1, 2, 3]) for i in range(3)],
    )
    return {**job.model_dump(mode="json"), **fields}


def push(phone: EmulatedDevice, job: object | None, raw: bytes | None = None) -> Path:
    """Documents with a stand-in package (no tokens are computed) and job.json as given."""
    documents = phone.documents(HARNESS_BUNDLE_ID)
    package = documents / package_path(SHA)
    package.mkdir(parents=True)
    (package / "Manifest.json").write_bytes(b"{}".ljust(PACKAGE_BYTES))
    (package.parent / COMPLETE_MARKER).write_text("{}")
    if raw is not None:
        (documents / JOB_FILE).write_bytes(raw)
    elif job is not None:
        (documents / JOB_FILE).write_text(json.dumps(job))
    return documents


def launch(phone: EmulatedDevice, documents: Path, **environment: str) -> tuple[str, str]:
    process = phone.new_process(HARNESS_BUNDLE_ID)
    return run_harness(
        phone, process, documents, HarnessLog(phone, process, documents), environment
    )


def done(documents: Path) -> DoneMarker:
    return DoneMarker.model_validate_json((documents / DONE_MARKER).read_text())


def results(documents: Path) -> RunResult:
    return RunResult.model_validate_json((documents / RESULTS_FILE).read_text())


def test_memory_is_the_decode_footprint_with_the_compile_peak_apart(
    phone: EmulatedDevice,
) -> None:
    documents = push(phone, make_job())

    assert launch(phone, documents) == ("exited", "exit code 0")

    result = results(documents)
    runtime = phone.timing.runtime_overhead_bytes
    kv = TINY_GQA.num_layers * 2 * TINY_GQA.num_key_value_heads * CONTEXT * TINY_GQA.head_dim * 2
    assert result.peak_memory_bytes == runtime + PACKAGE_BYTES + kv
    assert result.compile_peak_memory_bytes == runtime + 2 * PACKAGE_BYTES
    assert "footprint sampled after every timed step" in result.timing_model
    assert result.low_power_mode is False
    assert done(documents).ok and done(documents).reason is None


class WarmingCondition(Condition):
    """A phone whose thermal state is read from a script, one entry per read."""

    def __init__(self, states: list[ThermalState]) -> None:
        super().__init__()
        self.script = states
        self.reads = 0

    @property  # type: ignore[override]
    def thermal_state(self) -> ThermalState:
        state = self.script[min(self.reads, len(self.script) - 1)]
        self.reads += 1
        return state

    @thermal_state.setter
    def thermal_state(self, value: ThermalState) -> None:
        pass


def test_the_thermal_state_is_sampled_after_every_prompt(phone: EmulatedDevice) -> None:
    nominal, fair, serious = ThermalState.nominal, ThermalState.fair, ThermalState.serious
    # reads: before the wait, at the start, after each of 3 prompts, at the end
    phone.condition = WarmingCondition([nominal, nominal, nominal, fair, serious, serious])
    documents = push(phone, make_job())

    launch(phone, documents)

    result = results(documents)
    assert result.prompt_thermal_states == [nominal, fair, serious]
    assert (result.thermal_state_start, result.thermal_state_end) == (nominal, serious)
    assert result.thermal_wait_ms == 0


def test_a_warm_phone_waits_the_bounded_time_for_nominal_then_measures(
    phone: EmulatedDevice,
) -> None:
    phone.condition.thermal_state = ThermalState.fair
    documents = push(phone, make_job(thermal_wait_s=5))

    launch(phone, documents)

    result = results(documents)
    assert result.thermal_wait_ms == 5000
    assert result.thermal_state_start == ThermalState.fair
    assert result.prompt_thermal_states == [ThermalState.fair] * 3


def test_an_interrupted_run_is_abandoned_with_its_reason(phone: EmulatedDevice) -> None:
    phone.faults.arm("interrupt")
    documents = push(phone, make_job())

    launch(phone, documents)

    marker = done(documents)
    assert (marker.run_id, marker.ok, marker.reason) == (5, False, FailureReason.interrupted)
    assert marker.error is not None
    assert marker.error.startswith("interrupted: the app left the foreground")
    assert "during prompt 1" in marker.error
    assert not (documents / RESULTS_FILE).exists()
    assert "failed (interrupted)" in (documents / "harness.log").read_text()


@pytest.mark.parametrize(
    ("job", "raw", "run_id", "reason", "message"),
    [
        (None, None, 42, FailureReason.missing_job, "no job.json in Documents"),
        (None, b"{not json", 42, FailureReason.bad_job, "unreadable job.json"),
        (
            make_job(decode_tokens="many"),
            None,
            5,
            FailureReason.bad_job,
            "decode_tokens: Input should be a valid integer",
        ),
        (
            make_job(protocol_version=2),
            None,
            5,
            FailureReason.protocol_version,
            "job.json speaks harness protocol 2, the harness speaks 1",
        ),
        (
            make_job(warmup_steps=CONTEXT + 1),
            None,
            5,
            FailureReason.bad_job,
            "warmup_steps 129 exceeds the context of 128 tokens",
        ),
        (
            make_job(decode_tokens=CONTEXT),
            None,
            5,
            FailureReason.bad_job,
            "3 prompt tokens + 128 decode tokens need 130 KV positions",
        ),
    ],
)
def test_a_job_that_cannot_run_still_ends_with_a_marker_that_says_why(
    phone: EmulatedDevice,
    job: object,
    raw: bytes | None,
    run_id: int,
    reason: FailureReason,
    message: str,
) -> None:
    documents = push(phone, job, raw)

    assert launch(phone, documents, DECODEBENCH_RUN_ID="42") == ("exited", "exit code 1")

    marker = done(documents)
    assert (marker.run_id, marker.ok, marker.reason) == (run_id, False, reason)
    assert marker.error is not None and message in marker.error


def install(phone: EmulatedDevice, bundle_id: str, info: dict[str, object]) -> None:
    phone.install(
        AppRecord(bundle_id, "1", "1.0", "harness", phone.root / "apps" / bundle_id, info)
    )


def test_a_harness_under_any_bundle_id_launches_and_other_apps_do_not(
    phone: EmulatedDevice,
) -> None:
    install(phone, "org.example.lab.harness", {"DecodebenchHarnessProtocol": 1})
    install(phone, "org.example.notes", {})

    pid = launch_app(phone, "org.example.lab.harness", ["--job", JOB_FILE], {})

    assert phone.processes[pid].bundle_id == "org.example.lab.harness"
    with pytest.raises(LaunchRefused, match="org.example.notes declares no DecodebenchHarness"):
        launch_app(phone, "org.example.notes", [])


def test_auto_tokens_run_without_ids_when_the_interpreter_cannot_read_the_package(
    tmp_path: Path,
) -> None:
    phone = EmulatedFleet(tmp_path / "devices", tokens="auto").add("iphone-17-pro")
    documents = push(phone, make_job())

    assert launch(phone, documents) == ("exited", "exit code 0")

    assert all(prompt.token_ids is None for prompt in results(documents).prompts)
    assert (
        "no token ids: the MIL interpreter cannot run it" in (documents / "harness.log").read_text()
    )


def test_mil_tokens_asked_for_explicitly_fail_the_run_when_the_package_is_unreadable(
    tmp_path: Path,
) -> None:
    phone = EmulatedFleet(tmp_path / "devices", tokens="mil").add("iphone-17-pro")
    documents = push(phone, make_job())

    launch(phone, documents)

    marker = done(documents)
    assert (marker.ok, marker.reason) == (False, FailureReason.model_error)
