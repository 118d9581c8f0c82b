"""`decodebench doctor PKG` as a user runs it, on packages converted by the Apple recipe."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.support.cli import run_cli

pytestmark = pytest.mark.slow  # the fixtures convert models


def test_doctor_on_a_stateful_package_with_its_checkpoint(
    massive_llama_package, massive_llama_checkpoint, tmp_path
):
    from decodebench.contracts.doctor import DoctorReport
    from decodebench.formats.coreml.program import load_package

    out = tmp_path / "cured.mlpackage"
    done = run_cli(
        "doctor", str(massive_llama_package), "--weights", str(massive_llama_checkpoint),
        "--prompts", "2", "--steps", "4", "--out", str(out), "--json",
    )  # fmt: skip

    assert done.returncode == 0, done.stderr
    report = DoctorReport.model_validate_json(done.stdout)
    first = report.headroom.first_non_finite
    assert first is not None and first.label == "layer 1 · input norm · square"
    assert {hazard.layer for hazard in report.headroom.overflows} == {1, 2, None}
    assert report.repair.applied == ["norms"] and report.repair.result.share == 1.0
    assert report.repair.target == str(out)
    # The checkpoint is the package's own model: transformers fp32 decodes the same tokens.
    assert report.checkpoint is not None
    assert report.checkpoint.weights == str(massive_llama_checkpoint)
    assert report.checkpoint.reference.share == 1.0
    assert report.checkpoint.repaired.candidate == "norms"
    assert report.checkpoint.repaired.share == 1.0
    assert report.repaired_analysis is not None
    assert report.repaired_analysis.dispatch_ops > report.analysis.dispatch_ops  # the rewrite's ops
    assert load_package(out).program.functions["main"] is not None
    progress = done.stderr.splitlines()
    assert "doctor: prompt 1/2: " in done.stderr and "doctor: prompt 2/2: " in done.stderr
    assert progress[0].startswith("doctor: 2 chat prompts as pseudo-tokens of ")


def test_doctor_on_a_kv_as_io_package_names_the_cache_traffic(
    massive_llama_io_package, massive_llama_checkpoint, tmp_path
):
    from decodebench.formats.coreml.program import load_package

    package = tmp_path / "io.mlpackage"
    shutil.copytree(massive_llama_io_package, package)
    done = run_cli(
        "doctor", str(package), "--weights", str(massive_llama_checkpoint),
        "--prompts", "2", "--steps", "3",
    )  # fmt: skip

    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert "first non-finite in fp16: layer 1 · input norm · square" in text
    assert "overflowing: layers 1-2 and the head" in text
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("  KV cache as I/O: "))
    # key_cache and value_cache [3 layers, 1, 2 heads, 64 positions, 16] fp16, written out whole
    # every step where a state writes one position: the other 63 positions are the waste.
    assert f"{2 * 3 * 2 * 63 * 16 * 2 / 1024:,.1f} KiB/token" in lines[at]
    assert "states" in " ".join(lines[at : at + 3])
    assert "applied        norms" in text
    assert "package fp32             2/2 prompts identical (100%)" in text
    assert "analysis (predictions from bytes per token, not measurements)" in text
    assert "predicted iphone-17-pro" in text
    default = tmp_path / "io.repaired.mlpackage"  # beside PKG
    assert default.is_dir() and load_package(default).program is not None


def one_line_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    from decodebench.cli import main

    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert captured.out == ""
    assert lines[0].startswith("decodebench doctor: error: ")
    return lines[0]


def test_bad_inputs_are_refused_in_one_line_with_nothing_written(
    massive_llama_package, massive_llama_checkpoint, tiny_llama_folder, tmp_path, capsys
):
    package, weights = str(massive_llama_package), str(massive_llama_checkpoint)
    out = tmp_path / "out.mlpackage"
    common = ["--weights", weights, "--out", str(out)]

    empty = tmp_path / "empty.mlpackage"
    empty.mkdir()
    assert "is not an .mlpackage" in one_line_error(["doctor", str(empty), *common], capsys)
    line = one_line_error(["doctor", package, *common, "--prompts", "31"], capsys)
    assert "--prompts must be between 1 and 30" in line
    line = one_line_error(["doctor", package, *common, "--prompts", "1", "--steps", "500"], capsys)
    assert "the package's context is 64" in line
    # A checkpoint of another model: tiny-llama's vocabulary and width are not the package's.
    line = one_line_error(
        ["doctor", package, "--weights", str(tiny_llama_folder), "--out", str(out), "--prompts",
         "1", "--steps", "2"],
        capsys,
    )  # fmt: skip
    assert "is not the package's checkpoint" in line and "vocabulary" in line
    assert not out.exists()

    out.mkdir()
    (out / "keep").write_text("mine")
    line = one_line_error(["doctor", package, *common, "--prompts", "1"], capsys)
    assert f"{out} exists (pass --force to replace it)" in line
    assert [path.name for path in out.iterdir()] == ["keep"]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["empty.mlpackage", "out.mlpackage"]


def test_a_tokenizer_of_another_model_is_refused(
    massive_llama_package, smollm2_folder, tmp_path, capsys
):
    out = tmp_path / "out.mlpackage"
    argv = ["doctor", str(massive_llama_package), "--model", "smollm2-135m", "--out", str(out)]
    line = one_line_error([*argv, "--prompts", "2"], capsys)
    assert "the package's vocabulary is 0..127 (a tokenizer of another model?)" in line
    assert not out.exists()


def test_the_default_output_sits_beside_the_package() -> None:
    from decodebench.commands.doctor import default_out

    assert default_out(Path("/a/b/model.mlpackage")) == Path("/a/b/model.repaired.mlpackage")
