"""``decodebench build --format coreai`` as a user runs it: an ``.aimodel`` and its report,
``analyze`` on it, and ``verify`` between the Core AI and the Core ML build of one model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.decodebench.test_cli import run_cli

pytestmark = pytest.mark.slow


def test_build_analyze_and_verify_a_core_ai_build_against_core_ml(tmp_path: Path) -> None:
    common = ["--preset", "tiny-gqa", "--attention", "folded", "--context", "128", "--quiet"]
    built = run_cli("build", "--format", "coreai", *common, "--out", str(tmp_path / "ai"))
    assert built.returncode == 0, built.stderr
    assert "model.aimodel" in built.stdout
    report = json.loads((tmp_path / "ai" / "build.json").read_text())
    assert report["package"] == "model.aimodel"
    assert report["variant"]["format"] == "coreai" and report["variant"]["kv"] == "input"
    assert {"coreai-core", "coreai-torch"} <= set(report["toolchain"])
    # The build's check: one decode step held op by op to Apple's runtime.
    assert report["reference_check"].startswith("held op by op to Apple's runtime at position 3")
    assert report["reference_check"] in built.stdout
    assert "hold_to_reference" in report["stage_seconds"]
    assert report["warnings"] == []  # no known phone fault in the project's build

    analysed = run_cli("analyze", str(tmp_path / "ai" / "model.aimodel"), "--json")
    assert analysed.returncode == 0, analysed.stderr
    assert json.loads(analysed.stdout)["tile_ops"] == 0

    core_ml = run_cli("build", *common, "--out", str(tmp_path / "ml"))
    assert core_ml.returncode == 0, core_ml.stderr
    assert json.loads((tmp_path / "ml" / "build.json").read_text())["key"] != report["key"]
    verified = run_cli(
        "verify", str(tmp_path / "ml" / "model.mlpackage"), str(tmp_path / "ai" / "model.aimodel"),
        "--steps", "12",
    )  # fmt: skip
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert ": AGREE" in verified.stdout


def test_a_core_ai_build_refuses_what_it_cannot_build_yet_by_name(tmp_path: Path) -> None:
    refused = run_cli(
        "build", "--format", "coreai", "--preset", "tiny-gqa", "--quant", "base",
        "--context", "128", "--out", str(tmp_path / "base"), "--quiet",
    )  # fmt: skip
    assert refused.returncode == 2
    assert "quant: 'base' gives its targets different schemes" in refused.stderr
    assert not (tmp_path / "base").exists()
    state = run_cli(
        "build", "--format", "coreai", "--kv", "state", "--preset", "tiny-gqa",
        "--context", "128", "--out", str(tmp_path / "state"), "--quiet",
    )  # fmt: skip
    assert state.returncode == 2
    assert "kv: a Core AI build keeps its KV cache as inputs for now" in state.stderr


def test_a_build_the_engine_computes_wrongly_is_not_published(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import numpy as np

    from decodebench.building.build import build_variant
    from decodebench.building.job import BuildError
    from decodebench.contracts.domain import VariantSpec
    from decodebench.formats.coreai import engine as engine_module
    from decodebench.formats.coreai.kernels import KERNELS

    right = KERNELS["rsqrt"]
    monkeypatch.setitem(KERNELS, "rsqrt", lambda values: right(values) * np.float32(1.01))
    monkeypatch.setattr(engine_module, "KERNELS", KERNELS)
    variant = VariantSpec(format="coreai", attention="folded", context=64)
    with pytest.raises(BuildError, match=r"not published: .*op #\d+ 'rsqrt_\d+'"):
        build_variant("tiny-gqa", variant, tmp_path / "out")
    assert not (tmp_path / "out" / "model.aimodel").exists()
