"""The avoidable bytes per token of a package, each with its fix and the tok/s after it."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow  # the fixtures convert models


def test_kv_cache_as_inputs_and_outputs_is_named_with_its_bytes(
    massive_llama_io_package, massive_llama_package
):
    from decodebench.analysis.analyze import analyze_mlpackage
    from decodebench.mil.waste import find_waste, render

    analysis = analyze_mlpackage(massive_llama_io_package)
    found = {waste.kind: waste for waste in find_waste(massive_llama_io_package, analysis)}

    kv = found["KV cache as I/O"]
    # key_cache and value_cache [3 layers, 1, 2 heads, 64 positions, 16] fp16, in and out whole.
    assert kv.bytes_per_token == 2 * 2 * (3 * 1 * 2 * 64 * 16 * 2)
    assert "states" in kv.fix and not kv.applicable
    before = analysis.predicted_tok_s()
    assert all(kv.predicted_tok_s_after[device] > before[device] for device in before)
    assert any(
        line.startswith("  KV cache as I/O: ") for line in render(list(found.values()), analysis)
    )

    stateful = find_waste(massive_llama_package)
    assert "KV cache as I/O" not in {waste.kind for waste in stateful}
    masks = [waste for waste in stateful if waste.kind == "full-context masks"]
    assert [waste.bytes_per_token for waste in masks] == [64 * 2]  # [1, 1, 1, 64] fp16


def test_the_kv_as_io_layout_is_driven_diagnosed_and_repaired(massive_llama_io_package, tmp_path):
    from decodebench.mil.headroom import measure_headroom
    from decodebench.mil.repair import repair_mlpackage

    prompts = [[1, 2, 3, 4], [9, 8, 7]]
    report = measure_headroom(massive_llama_io_package, prompts, steps=3)
    assert report.first_non_finite is not None
    assert report.first_non_finite.label == "layer 1 · input norm · square"

    repaired = repair_mlpackage(massive_llama_io_package, tmp_path / "io.mlpackage", prompts, 3)
    assert repaired.applied == ["norms"]
    assert repaired.result.share == 1.0
