"""The `decodebench` command as a user runs it: real processes, real conversion."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from decodebench.contracts.presets import TINY_GQA
from tests.support.cli import run_cli


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_analyze_a_missing_path(tmp_path: Path) -> None:
    line = one_line_error(run_cli("analyze", str(tmp_path / "nope.mlpackage")))
    assert line.startswith("decodebench: error: ") and "does not exist" in line


def test_analyze_something_that_is_not_an_mlpackage(tmp_path: Path) -> None:
    folder = tmp_path / "model.mlpackage"
    folder.mkdir()
    line = one_line_error(run_cli("analyze", str(folder)))
    assert "is not an .mlpackage" in line and "Manifest.json" in line


def test_repair_something_that_is_not_an_mlpackage(tmp_path: Path) -> None:
    line = one_line_error(run_cli("repair", str(tmp_path), str(tmp_path / "out.mlpackage")))
    assert line.startswith("decodebench repair: error: ") and "is not an .mlpackage" in line


def test_repair_needs_a_tokenizer_for_its_prompts(tmp_path: Path) -> None:
    package = tmp_path / "in.mlpackage"
    package.mkdir()
    (package / "Manifest.json").write_text("{}")
    weights = tmp_path / "weights"
    weights.mkdir()
    out = str(tmp_path / "out.mlpackage")
    line = one_line_error(run_cli("repair", str(package), out, "--weights", str(weights)))
    assert "holds no tokenizer" in line
    line = one_line_error(run_cli("repair", str(package), out, "--prompts", "0"))
    assert "--prompts must be between 1 and 30" in line
    assert not Path(out).exists()


def test_build_an_unknown_preset(tmp_path: Path) -> None:
    line = one_line_error(run_cli("build", "--preset", "gpt-17", "--out", str(tmp_path)))
    assert "unknown preset 'gpt-17'" in line and "tiny-gqa" in line


def test_build_an_impossible_context(tmp_path: Path) -> None:
    line = one_line_error(
        run_cli("build", "--preset", "tiny-gqa", "--context", "10", "--out", str(tmp_path))
    )
    assert line == "decodebench: error: --context: Input should be greater than or equal to 64"


def test_submit_without_a_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DECODEBENCH_TOKEN", raising=False)
    line = one_line_error(run_cli("submit", "--server", "http://127.0.0.1:9"))
    assert "no API token" in line


@pytest.mark.slow
def test_build_then_analyze_json(tmp_path: Path) -> None:
    built = run_cli(
        "build", "--preset", "tiny-gqa", "--attention", "repeat_kv", "--context", "128",
        "--out", str(tmp_path / "rkv"), "--quiet",
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    assert (tmp_path / "rkv" / "build.json").is_file()
    result = run_cli("analyze", str(tmp_path / "rkv" / "model.mlpackage"), "--json")
    assert result.returncode == 0, result.stderr
    analysis = json.loads(result.stdout)
    for field in (
        "ops_total",
        "op_counts",
        "tile_ops",
        "tile_output_bytes",
        "state_write_ops",
        "weight_bytes",
    ):
        assert field in analysis
    layers, heads, head_dim = TINY_GQA.num_layers, TINY_GQA.num_attention_heads, TINY_GQA.head_dim
    assert analysis["tile_ops"] == 2 * layers
    assert analysis["tile_output_bytes"] == 2 * layers * heads * 128 * head_dim * 2
    assert analysis["op_counts"]["tile"] == analysis["tile_ops"]
