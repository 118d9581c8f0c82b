"""The kv_window variant axis: refused by name where the ring cannot be built."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from decodebench.contracts.domain import SweepSpec, VariantSpec


def test_kv_window_is_a_decode_state_axis() -> None:
    with pytest.raises(ValidationError, match="kv_window needs kv=state"):
        VariantSpec(kv="input", kv_window=True)
    with pytest.raises(ValidationError, match="kv_window has no prefill function"):
        VariantSpec(kv_window=True, prefill_chunk=8)
    windowed = VariantSpec(kv_window=True, context=1024)
    assert windowed.label == "folded-ctx1024-fp16-kvwin"
    assert windowed.graph_identity()["kv_window"] is True


def test_builds_keyed_before_the_axis_keep_their_identity() -> None:
    assert "kv_window" not in VariantSpec().graph_identity()


def test_a_sweep_refuses_kv_window_for_a_model_without_sliding_layers() -> None:
    spec = {"variants": [{"kv_window": True}], "devices": ["iphone-17-pro"], "decode_tokens": 8}
    with pytest.raises(ValidationError, match="qwen3-0.6b has no sliding-window layers"):
        SweepSpec(model="qwen3-0.6b", **spec)
    assert SweepSpec(model="gemma-3-1b", **spec).variants[0].kv_window
