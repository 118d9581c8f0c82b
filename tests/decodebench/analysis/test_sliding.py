"""Sliding-window layers in the analysis: a sliding layer's cache counted at its window when the
build keeps a ring of the window (``kv_window``), at the context otherwise, and the saving of the
windowed layout reported for both (real conversions of a tiny Gemma 3 shape)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from decodebench.analysis.analyze import analyze_mlpackage, render_analysis
from decodebench.contracts.analysis import GraphAnalysis
from decodebench.contracts.domain import VariantSpec
from decodebench.contracts.presets import GEMMA_3_1B, ModelConfig
from decodebench.formats.coreml.convert import (
    DECODE_FUNCTION,
    PREFILL_FUNCTION,
    Conversion,
    CoreMLToolsConverter,
)
from decodebench.formats.coreml.program import quiet_coremltools
from decodebench.modeling import build_model

pytestmark = pytest.mark.slow

CONTEXT = 64
# Gemma 3's layout in three narrow layers: two sliding ones, then a global one.
CONFIG: ModelConfig = GEMMA_3_1B.model_copy(
    update={
        "name": "tiny-gemma3",
        "num_layers": 3,
        "hidden_size": 64,
        "intermediate_size": 128,
        "vocab_size": 256,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "sliding_layers": (1, 1, 0),
        "sliding_window": 16,
        "query_pre_attn_scalar": 16,
    }
)
FP16_BYTES = 2


def _package(root: Path, kv_window: bool) -> GraphAnalysis:
    variant = VariantSpec(context=CONTEXT, kv_window=kv_window)
    model = build_model(
        CONFIG, CONTEXT, variant.attention, torch.float16, variant.kv, kv_window=kv_window
    )
    path = root / f"{variant.label}.mlpackage"
    with quiet_coremltools():
        CoreMLToolsConverter().build_package(
            {DECODE_FUNCTION: model}, Conversion(CONFIG, variant), path
        )
    return analyze_mlpackage(path)


@pytest.fixture(scope="module")
def analyses(tmp_path_factory: pytest.TempPathFactory) -> dict[bool, GraphAnalysis]:
    root = tmp_path_factory.mktemp("sliding")
    return {kv_window: _package(root, kv_window) for kv_window in (False, True)}


def _per_position() -> int:
    # One cache (K or V) of one layer, one position: every KV head's head_dim values in fp16.
    return CONFIG.num_key_value_heads * CONFIG.head_dim * FP16_BYTES


def _sliding(name: str) -> bool:
    index = int(name.rsplit("_", 1)[1])
    return bool(CONFIG.sliding_layers and CONFIG.sliding_layers[index])


def test_a_ring_counts_window_positions_a_global_cache_the_context(
    analyses: dict[bool, GraphAnalysis],
) -> None:
    window = CONFIG.sliding_window
    assert window is not None and window < CONTEXT
    states = analyses[True].states
    assert len(states) == 2 * CONFIG.num_layers
    for state in states:
        assert state.bytes_per_position == _per_position()
        if _sliding(state.name):
            assert (state.window, state.positions) == (window, window)
            assert state.bytes == window * _per_position()
        else:
            assert (state.window, state.positions) == (0, CONTEXT)
            assert state.bytes == CONTEXT * _per_position()
    assert analyses[True].bytes_per_token.kv_read == sum(state.bytes for state in states)


def test_full_context_caches_are_read_whole_and_seen_up_to_the_window(
    analyses: dict[bool, GraphAnalysis],
) -> None:
    window = CONFIG.sliding_window or 0
    for state in analyses[False].states:
        assert state.bytes == CONTEXT * _per_position()  # the static graph reads it all
        late = CONTEXT - 1
        seen = window if _sliding(state.name) else CONTEXT
        assert state.window == (window if _sliding(state.name) else 0)
        assert state.read_at(late) == seen * _per_position()  # what a position-aware kernel reads
        assert state.read_at(3) == 4 * _per_position()


def test_both_builds_report_the_saving_of_the_ring(analyses: dict[bool, GraphAnalysis]) -> None:
    window = CONFIG.sliding_window or 0
    sliding_caches = 2 * sum(CONFIG.sliding_layers or ())
    saving = sliding_caches * (CONTEXT - window) * _per_position()
    full, ring = analyses[False], analyses[True]
    for analysis in (full, ring):
        report = analysis.sliding_window
        assert report is not None
        assert (report.window, report.context) == (window, CONTEXT)
        assert (report.sliding_caches, report.caches) == (sliding_caches, 2 * CONFIG.num_layers)
        assert report.saving == saving
    assert full.sliding_window is not None and ring.sliding_window is not None
    # Each build's own total is the figure of its layout.
    assert not full.sliding_window.windowed
    assert full.sliding_window.full_context_bytes == full.bytes_per_token.total
    assert ring.sliding_window.windowed
    assert ring.sliding_window.windowed_bytes == ring.bytes_per_token.total
    assert full.bytes_per_token.kv_read - ring.bytes_per_token.kv_read == saving
    # Fewer bytes, so a faster prediction on every device class.
    for before, after in full.predicted_layouts().values():
        assert after > before
    text = render_analysis(full, "full")
    assert "2 of 3 layers see the last 16 of 64 positions" in text
    assert f"{full.sliding_window.windowed_bytes:,} bytes per token" in text


def test_no_sliding_layers_no_saving(tmp_path: Path) -> None:
    config = CONFIG.model_copy(update={"family": "qwen3", "sliding_layers": None})
    variant = VariantSpec(context=CONTEXT)
    model = build_model(config, CONTEXT, variant.attention, torch.float16, variant.kv)
    path = tmp_path / "plain.mlpackage"
    with quiet_coremltools():
        CoreMLToolsConverter().build_package(
            {DECODE_FUNCTION: model}, Conversion(config, variant), path
        )
    analysis = analyze_mlpackage(path)
    assert analysis.sliding_window is None and analysis.predicted_layouts() == {}
    assert all(state.window == 0 for state in analysis.states)
    with pytest.raises(ValueError, match="no sliding-window layers"):
        build_model(config, CONTEXT, variant.attention, torch.float16, variant.kv, kv_window=True)


def test_a_package_with_a_prefill_function_keeps_the_sliding_layers(tmp_path: Path) -> None:
    """A multifunction package (decode + prefill) is written anew by coremltools: the build's
    metadata on sliding layers survives it, so the saving is still reported."""
    variant = VariantSpec(context=CONTEXT, prefill_chunk=8)
    decode = build_model(CONFIG, CONTEXT, variant.attention, torch.float16, variant.kv)
    prefill = decode.sibling(8)
    path = tmp_path / "prefill.mlpackage"
    with quiet_coremltools():
        CoreMLToolsConverter().build_package(
            {DECODE_FUNCTION: decode, PREFILL_FUNCTION: prefill}, Conversion(CONFIG, variant), path
        )
    analysis = analyze_mlpackage(path)
    assert analysis.sliding_window is not None
    assert analysis.sliding_window.sliding_caches == 2 * sum(CONFIG.sliding_layers or ())
