"""An emulated Core AI run takes its token ids from the pushed ``.aimodel`` itself.

A real tiny-gqa asset (coreai-torch, context 64) is pushed where a Core AI job's package goes;
the emulated harness decodes it on the project's Core AI engine, and its token ids are the ones
the engine gives for the same prompts driven on its own. The ``auto`` size limit holds as for
Core ML; a damaged asset runs without ids under ``auto`` and fails the run as a model error
under ``mil``, as does a prompt token outside its vocabulary; a job whose package is of the
other format is a missing package.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from decodebench.building.agreement import EngineDecoder
from decodebench.contracts.domain import VariantSpec
from decodebench.contracts.presets import get_preset
from decodebench.contracts.results import RunResult
from decodebench.formats.coreai.session import open_session
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
from emulator import run_tokens
from emulator.app import HarnessLog, run_harness
from emulator.device import EmulatedDevice
from emulator.fleet import EmulatedFleet

pytestmark = pytest.mark.slow  # converts a real tiny-gqa asset with coreai-torch

SHA = "ae" * 32
CONTEXT = 64
VARIANT = VariantSpec(format="coreai", context=CONTEXT)
PROMPTS = [[5, 17, 300, 2], [400, 1, 44]]
DECODE = 3


@pytest.fixture(scope="module")
def asset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from decodebench.formats.coreai.convert import convert_preset

    root = tmp_path_factory.mktemp("coreai-asset")
    return convert_preset(get_preset("tiny-gqa"), VARIANT, root / "model.aimodel")


def job(engine: str = "coreai") -> HarnessJob:
    return HarnessJob(
        run_id=8,
        model="tiny-gqa",
        variant_label=VARIANT.label,
        device_class="iphone-17-pro",
        artifact_sha256=SHA,
        package_path=package_path(SHA, engine),
        engine=engine,
        bytes_per_token=2_000_000,
        context_tokens=CONTEXT,
        decode_tokens=DECODE,
        prompt_set_version="builtin-v1",
        variant=VARIANT if engine == "coreai" else VariantSpec(context=CONTEXT),
        prompts=[HarnessPrompt(index=i, token_ids=ids) for i, ids in enumerate(PROMPTS)],
    )


def pushed(tmp_path: Path, tokens: str, asset: Path, harness_job: HarnessJob) -> tuple:
    phone = EmulatedFleet(tmp_path / "devices", tokens=tokens).add("iphone-17-pro")
    documents = phone.documents(HARNESS_BUNDLE_ID)
    package = documents / package_path(SHA, "coreai")
    shutil.copytree(asset, package)
    (package.parent / COMPLETE_MARKER).write_text("{}")
    (documents / JOB_FILE).write_text(harness_job.model_dump_json())
    return phone, documents


def launch(phone: EmulatedDevice, documents: Path) -> tuple[str, str]:
    process = phone.new_process(HARNESS_BUNDLE_ID)
    return run_harness(phone, process, documents, HarnessLog(phone, process, documents), {})


def results(documents: Path) -> RunResult:
    return RunResult.model_validate_json((documents / RESULTS_FILE).read_text())


def done(documents: Path) -> DoneMarker:
    return DoneMarker.model_validate_json((documents / DONE_MARKER).read_text())


def test_token_ids_are_the_pushed_assets_on_the_core_ai_engine(asset: Path, tmp_path: Path) -> None:
    phone, documents = pushed(tmp_path, "auto", asset, job())

    assert launch(phone, documents) == ("exited", "exit code 0")

    result = results(documents)
    decoder = EngineDecoder(open_session(asset))
    expected = [decoder.greedy(prompt, DECODE) for prompt in PROMPTS]
    assert [prompt.token_ids for prompt in result.prompts] == expected
    assert len({tuple(ids) for ids in expected}) == 2  # the prompts decode differently
    assert "greedy tokens from the pushed .aimodel run by the project's Core AI engine" in (
        result.timing_model
    )
    assert "no Core AI executed" in result.timing_model
    assert "load cold (specialization) = " in result.timing_model
    assert result.simulated is True


def test_auto_runs_a_larger_asset_without_token_ids(
    asset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(run_tokens, "MIL_AUTO_MAX_BYTES", 1024)
    phone, documents = pushed(tmp_path, "auto", asset, job())

    assert launch(phone, documents) == ("exited", "exit code 0")

    assert all(prompt.token_ids is None for prompt in results(documents).prompts)


@pytest.mark.parametrize("tokens", ["auto", "mil"])
def test_an_asset_the_engine_cannot_read(tokens: str, asset: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken.aimodel"
    shutil.copytree(asset, broken)
    (broken / "main.mlirb").write_bytes(b"not a program")  # its main.hash no longer matches
    phone, documents = pushed(tmp_path, tokens, broken, job())

    launch(phone, documents)

    if tokens == "auto":
        assert all(prompt.token_ids is None for prompt in results(documents).prompts)
        log = (documents / "harness.log").read_text()
        assert "no token ids: the Core AI engine cannot run it" in log
    else:
        marker = done(documents)
        assert (marker.ok, marker.reason) == (False, FailureReason.model_error)
        assert "main.mlirb does not match its main.hash" in (marker.error or "")


def test_a_token_outside_the_assets_vocabulary_fails_the_run_naming_it(
    asset: Path, tmp_path: Path
) -> None:
    outside = job().model_copy(update={"prompts": [HarnessPrompt(index=0, token_ids=[600])]})
    phone, documents = pushed(tmp_path, "auto", asset, outside)

    launch(phone, documents)

    marker = done(documents)
    assert (marker.ok, marker.reason) == (False, FailureReason.model_error)
    assert marker.error == "token 600 outside the vocabulary of 512"


def test_a_core_ml_job_finds_no_package_where_an_asset_was_pushed(
    asset: Path, tmp_path: Path
) -> None:
    phone, documents = pushed(tmp_path, "auto", asset, job("coreml"))

    launch(phone, documents)

    marker = done(documents)
    assert (marker.ok, marker.reason) == (False, FailureReason.missing_package)
    assert json.loads((documents / DONE_MARKER).read_text())["error"].startswith(
        "coreml model package models/"
    )
