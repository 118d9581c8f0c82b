"""The avoidable bytes per token of a package, each with its fix and the tok/s after it."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.slow  # the fixtures convert models


def test_kv_cache_as_inputs_and_outputs_is_named_with_its_bytes(
    massive_llama_io_package, massive_llama_package
):
    from decodebench.analysis.analyze import analyze_graphs, analyze_mlpackage
    from decodebench.doctor.waste import find_waste, render

    analysis, graphs = analyze_graphs(massive_llama_io_package)
    found = {waste.kind: waste for waste in find_waste(massive_llama_io_package, analysis, graphs)}

    kv = found["KV cache as I/O"]
    # key_cache and value_cache [3 layers, 1, 2 heads, 64 positions, 16] fp16 are returned whole
    # every step; as states each would be written one position (and read whole either way).
    cache, position = 3 * 1 * 2 * 64 * 16 * 2, 3 * 1 * 2 * 1 * 16 * 2
    assert kv.bytes_per_token == 2 * (cache - position)
    assert "states" in kv.fix and not kv.applicable
    before = analysis.predicted_tok_s()
    assert all(kv.predicted_tok_s_after[device] > before[device] for device in before)
    # The same weights converted with states: exactly the bytes the fix leaves.
    stateful_analysis = analyze_mlpackage(massive_llama_package)
    assert (
        analysis.bytes_per_token.total - kv.bytes_per_token
        == stateful_analysis.bytes_per_token.total
    )
    lines = render(list(found.values()), analysis)
    at = lines.index(next(line for line in lines if line.startswith("  KV cache as I/O: ")))
    assert lines[at + 1].startswith("    fix (not by decodebench repair): make the caches")
    assert lines[at + 2].startswith("    predicted tok/s after the fix: ")

    stateful = find_waste(massive_llama_package)  # reads the program itself
    assert "KV cache as I/O" not in {waste.kind for waste in stateful}
    masks = [waste for waste in stateful if waste.kind == "full-context masks"]
    assert [waste.bytes_per_token for waste in masks] == [64 * 2]  # [1, 1, 1, 64] fp16
    # RoPE's cos/sin table concatenated with itself is a copy, but not the fold's.
    copies = {waste.kind: waste for waste in stateful}
    assert "tiles and repeats" not in copies and not copies["pure copies"].applicable


def test_fp32_islands_and_a_dominant_lm_head(tmp_path):
    import coremltools as ct
    from coremltools.converters.mil import Builder as mb
    from coremltools.converters.mil.mil import types

    from decodebench.doctor.waste import PALETTE_BITS, find_waste
    from decodebench.formats.coreml.program import quiet_coremltools

    weight = np.random.default_rng(0).standard_normal((1024, 64)).astype(np.float16)

    @mb.program(input_specs=[mb.TensorSpec((1, 64), types.fp16)], opset_version=ct.target.iOS18)
    def step(x):
        wide = mb.cast(x=mb.mul(x=x, y=np.float16(2.0)), dtype="fp32")  # widened, computed on
        narrow = mb.cast(x=mb.mul(x=wide, y=wide), dtype="fp16")
        return mb.linear(x=narrow, weight=weight, name="logits")

    with quiet_coremltools():
        model = ct.convert(step, convert_to="mlprogram", skip_model_load=True,
                           minimum_deployment_target=ct.target.iOS18,
                           compute_precision=ct.precision.FLOAT32)  # fmt: skip
    model.save(str(tmp_path / "islands.mlpackage"))
    found = {waste.kind: waste for waste in find_waste(tmp_path / "islands.mlpackage")}

    assert found["fp32 islands"].bytes_per_token == 64 * 4  # the one fp32 [1, 64] value
    head = found["lm_head dominates"]
    assert head.bytes_per_token == weight.nbytes * (16 - PALETTE_BITS) // 16
    assert "palettize" in head.fix and not head.applicable
    assert set(found) == {"fp32 islands", "lm_head dominates"}


def test_the_kv_as_io_layout_is_driven_diagnosed_and_repaired(massive_llama_io_package, tmp_path):
    from decodebench.doctor.headroom import measure_headroom
    from decodebench.doctor.repair import repair_mlpackage

    prompts = [[1, 2, 3, 4], [9, 8, 7]]
    report = measure_headroom(massive_llama_io_package, prompts, steps=3)
    assert report.first_non_finite is not None
    assert report.first_non_finite.label == "layer 1 · input norm · square"

    repaired = repair_mlpackage(massive_llama_io_package, tmp_path / "io.mlpackage", prompts, 3)
    assert repaired.applied == ["norms"]
    assert repaired.result.share == 1.0
