"""The host driver decodes the built package at its stored precision on this CPU, for real."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from agent.drivers.base import Cancellation, DriverError, RunCancelled, run_on_device
from agent.drivers.host.driver import HostDriver, HostRoofline
from agent.runner import JobError, build_job, check_engine, check_result, failure_reason
from decodebench.contracts.domain import VariantSpec
from decodebench.contracts.protocol import RunAssignment, RunResult
from decodebench.harness import HarnessJob
from tests.support.paths import ROOT

CONTEXT = 128
DECODE_TOKENS = 5


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """tiny-gqa built in fp16, w4 and base (int4 + a LUT lm_head), zipped as the worker ships them."""
    from decodebench.building.build import build_variant

    built = {}
    for quant in ("fp16", "w4", "base"):
        out = tmp_path_factory.mktemp(quant)
        build_variant(
            "tiny-gqa", VariantSpec(attention="folded", context=CONTEXT, quant=quant), out
        )
        path = out.parent / f"{quant}-artifact.zip"
        with zipfile.ZipFile(path, "w") as archive:
            for file in sorted(out.rglob("*")):
                if file.is_file():
                    archive.write(file, file.relative_to(out).as_posix())
        built[quant] = path
    return built


def assignment(attention: str, artifact_path: Path, run_id: int = 5) -> RunAssignment:
    variant = VariantSpec(attention=attention, context=CONTEXT)
    return RunAssignment(
        run_id=run_id,
        sweep_id=1,
        build_id=1,
        model="tiny-gqa",
        variant=variant,
        variant_label=variant.label,
        device_class="iphone-17-pro",  # a class the agent was configured with
        prompts=2,
        decode_tokens=DECODE_TOKENS,
        artifact_sha256=artifact_path.stem,
        artifact_url="",
        bytes_per_token=1,
        lease_expires_at="2030-01-01T00:00:00+00:00",
        lease_seconds=60,
    )


def measure(tmp_path: Path, path: Path) -> tuple[RunResult, HostRoofline, HarnessJob]:
    driver = HostDriver(
        tmp_path / "host", device_class="iphone-17-pro", udid="host-test", threads=1
    )
    device = driver.discover()[0]
    job = build_job(assignment("folded", path), device)
    result = run_on_device(driver, device, path, job, Cancellation(), timeout_s=120)
    check_result(job, device, result)
    roofline = driver.roofline(job)
    assert roofline is not None
    return result, roofline, job


def interpreter_tokens(artifact_path: Path, tmp_path: Path, prompt: list[int]) -> list[int]:
    """The MIL reference interpreter's greedy tokens for the package inside the artifact."""
    from agent.drivers.host.decode import greedy_tokens
    from decodebench.formats.coreml.verify import open_session

    with zipfile.ZipFile(artifact_path) as archive:
        archive.extractall(tmp_path / "reference")
    session = open_session(tmp_path / "reference" / "model.mlpackage")

    class Reference:
        reset = session.reset
        step = session.next_token

    return greedy_tokens(Reference(), prompt, DECODE_TOKENS)


@pytest.mark.slow
def test_w4_reads_fewer_bytes_and_decodes_the_interpreters_tokens(
    tmp_path: Path, artifacts: dict[str, Path]
) -> None:
    from decodebench.contracts.presets import TINY_GQA
    from decodebench.modeling import build_model, greedy_decode

    fp16, fp16_roofline, job = measure(tmp_path, artifacts["fp16"])
    w4, w4_roofline, _ = measure(tmp_path, artifacts["w4"])

    assert set(fp16_roofline.kernels) == {"fp16"} and set(w4_roofline.kernels) == {"int4"}
    assert w4_roofline.weight_bytes_per_step < 0.4 * fp16_roofline.weight_bytes_per_step
    for result, roofline in ((fp16, fp16_roofline), (w4, w4_roofline)):
        assert result.driver == "host" and result.simulated is False
        assert "1 threads" in result.timing_model and "of the roofline" in result.timing_model
        assert 0 < roofline.fraction < 1
        assert result.peak_memory_bytes > 0 and result.load_time_warm_ms > 0
        for prompt in result.prompts:
            assert all(latency > 0 for latency in prompt.token_latencies_ms)
            assert prompt.decode_tok_s == pytest.approx(
                (DECODE_TOKENS - 1) / (sum(prompt.token_latencies_ms[1:]) / 1000)
            )
    prompt = job.prompts[0].token_ids
    assert w4.prompts[0].token_ids == interpreter_tokens(artifacts["w4"], tmp_path, prompt)
    assert fp16.prompts[0].token_ids == interpreter_tokens(artifacts["fp16"], tmp_path, prompt)
    expected, _ = greedy_decode(build_model(TINY_GQA, CONTEXT, "folded"), prompt, DECODE_TOKENS)
    assert fp16.prompts[0].token_ids == expected  # the fp32 PyTorch reference agrees


@pytest.mark.slow
def test_a_palettized_lm_head_is_decompressed_per_block_to_the_interpreters_tokens(
    tmp_path: Path, artifacts: dict[str, Path]
) -> None:
    base, roofline, job = measure(tmp_path, artifacts["base"])

    assert roofline.kernels == {"int4": 14, "blockwise": 1}
    prompt = job.prompts[0].token_ids
    assert base.prompts[0].token_ids == interpreter_tokens(artifacts["base"], tmp_path, prompt)


@pytest.mark.slow
def test_a_job_for_another_layout_than_the_artifact_is_refused(
    tmp_path: Path, artifacts: dict[str, Path]
) -> None:
    driver = HostDriver(tmp_path, device_class="iphone-17-pro", udid="host-test")
    device = driver.discover()[0]
    job = build_job(assignment("repeat_kv", artifacts["fp16"]), device)

    with pytest.raises(
        DriverError, match="built with attention folded, the job asks for repeat_kv"
    ):
        run_on_device(driver, device, artifacts["fp16"], job, Cancellation(), timeout_s=60)


def test_an_artifact_without_a_package_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "empty.zip"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("build.json", "{}")
    driver = HostDriver(tmp_path, device_class="iphone-17-pro", udid="host-test")
    with pytest.raises(DriverError, match="holds no .mlpackage"):
        driver.install(driver.discover()[0], path)


def test_a_core_ai_run_is_refused_by_name_before_its_artifact_is_fetched(tmp_path: Path) -> None:
    driver = HostDriver(tmp_path, device_class="iphone-17-pro", udid="host-test")
    device = driver.discover()[0]
    variant = VariantSpec(format="coreai", context=CONTEXT)
    coreai = assignment("folded", tmp_path / f"{'ab' * 32}.zip").model_copy(
        update={"variant": variant, "variant_label": variant.label}
    )
    job = build_job(coreai, device)

    with pytest.raises(JobError) as refused:
        check_engine(driver, job)
    reason, retryable = failure_reason(refused.value, "preparing the job")
    assert reason == (
        "cannot run this assignment: the host driver decodes coreml packages only; this run's "
        f"variant {variant.label} is in format coreai"
    )
    assert retryable is False
    check_engine(driver, build_job(assignment("folded", tmp_path / "x.zip"), device))


def test_a_core_ai_artifact_is_refused_at_install(tmp_path: Path) -> None:
    path = tmp_path / "asset.zip"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("build.json", "{}")
        archive.writestr("model.aimodel/main.mlirb", b"ML")
    driver = HostDriver(tmp_path, device_class="iphone-17-pro", udid="host-test")
    with pytest.raises(DriverError, match=r"is a Core AI asset \(.aimodel, format coreai\); the"):
        driver.install(driver.discover()[0], path)


@pytest.mark.slow
def test_a_cancelled_run_stops_before_measuring(tmp_path: Path, artifacts: dict[str, Path]) -> None:
    driver = HostDriver(tmp_path, device_class="iphone-17-pro", udid="host-test")
    device = driver.discover()[0]
    path = artifacts["fp16"]
    job = build_job(assignment("folded", path), device)
    driver.prepare(device)
    driver.install(device, path)
    driver.push(device, job)
    driver.launch(device, job)
    cancel = Cancellation()
    cancel.cancel("lease lost")

    with pytest.raises(RunCancelled, match="lease lost"):
        driver.wait(device, job, timeout_s=60, cancel=cancel)
    with pytest.raises(DriverError, match="produced no results"):
        driver.pull_results(device, job)


@pytest.mark.slow
def test_the_bench_prints_both_layouts_and_their_ratio() -> None:
    completed = subprocess.run(
        [
            sys.executable, "-m", "bench.host_decode", "--models", "tiny-gqa",
            "--context", "256", "--tokens", "4", "--repeats", "2", "--threads", "1",
        ],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip

    assert completed.returncode == 0, completed.stderr[-2000:]
    lines = completed.stdout.splitlines()
    assert any(line.strip().startswith("repeat_kv") and "tok/s" in line for line in lines)
    assert any(line.strip().startswith("folded") and "tok/s" in line for line in lines)
    assert any(
        "folded / repeat_kv = " in line and "same greedy tokens: yes" in line for line in lines
    )
