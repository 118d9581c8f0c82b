"""A Core AI graph read as a Core ML graph is: repeat_kv's replicated K/V appear as
``broadcast_in_dims`` of each cache (the copies the fold removes), bytes per token count them,
and every op the converter emits is one the engine runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import CONTEXT

pytestmark = pytest.mark.slow
LAYERS, KV_HEADS, HEAD_DIM, GROUP = 2, 8, 64, 4


def test_repeat_kv_replicates_each_cache_and_the_fold_removes_every_copy(
    coreai_assets: dict[str, Path],
) -> None:
    from decodebench.analysis.analyze import analyze_mlpackage

    repeated = analyze_mlpackage(coreai_assets["repeat_kv"])
    folded = analyze_mlpackage(coreai_assets["folded"])
    cache_copies = [
        copy for copy in repeated.redundant_ops if copy.source.endswith(("_cache_0", "_cache_1"))
    ]
    assert sorted(copy.source for copy in cache_copies) == [
        "key_cache_0", "key_cache_1", "value_cache_0", "value_cache_1",
    ]  # fmt: skip
    replica = GROUP * KV_HEADS * CONTEXT * HEAD_DIM * 2  # fp16 bytes of one replicated cache
    assert {copy.bytes for copy in cache_copies} == {replica}
    assert all(copy.kind == "broadcast_in_dims" for copy in cache_copies)
    assert folded.tile_ops == 0 and not folded.redundant_ops
    # The new token's K/V are replicated too (one row each): 2 per layer beside the caches.
    assert repeated.tile_ops == 4 * LAYERS
    saved = repeated.bytes_per_token.total - folded.bytes_per_token.total
    assert saved == repeated.bytes_per_token.redundant
    assert saved >= 2 * len(cache_copies) * replica


def test_the_caches_are_read_whole_and_the_weights_at_their_stored_width(
    coreai_assets: dict[str, Path],
) -> None:
    from decodebench.analysis.analyze import analyze_mlpackage

    analysis = analyze_mlpackage(coreai_assets["folded"])
    assert analysis.kv_source == "inputs"
    assert analysis.bytes_per_token.kv_read == 2 * LAYERS * KV_HEADS * CONTEXT * HEAD_DIM * 2
    assert analysis.weight_bytes_by_dtype.get("float16", 0) > 0.95 * analysis.weight_bytes
    assert not analysis.unknown_ops
    assert analysis.functions == ["main"]


def test_the_waste_of_a_core_ai_program_names_its_own_fix(coreai_assets: dict[str, Path]) -> None:
    from decodebench.doctor.waste import find_waste

    repeated = {waste.kind: waste for waste in find_waste(coreai_assets["repeat_kv"])}
    replicas = repeated["tiles and repeats"]
    # The rebuild is the fix; `decodebench repair` rewrites Core ML packages only.
    assert "--format coreai --attention folded" in replicas.fix
    assert not replicas.applicable
    assert "tiles and repeats" not in {waste.kind for waste in find_waste(coreai_assets["folded"])}
