"""`decodebench diff`: two tiny-gqa builds, repeat_kv (A) against folded (B)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from decodebench.analysis.analyze import analyze_mlpackage
from decodebench.analysis.diff import _unmatched, diff_analyses
from decodebench.building.build import build_variant
from decodebench.contracts.analysis import GraphAnalysis, RedundantCopy
from decodebench.contracts.domain import Attention, VariantSpec
from decodebench.contracts.presets import TINY_GQA
from decodebench.contracts.profiles import DEVICE_PROFILES, DeviceProfile
from tests.support.cli import run_cli

pytestmark = pytest.mark.slow

CONTEXT = 128
LAYERS = TINY_GQA.num_layers
TILE_BYTES = TINY_GQA.num_attention_heads * CONTEXT * TINY_GQA.head_dim * 2


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory) -> dict[Attention, Path]:
    root = tmp_path_factory.mktemp("diff")
    for attention in Attention:
        build_variant(
            TINY_GQA.name, VariantSpec(attention=attention, context=CONTEXT), root / attention.value
        )
    return {attention: root / attention.value / "model.mlpackage" for attention in Attention}


@pytest.fixture(scope="module")
def analyses(packages: dict[Attention, Path]) -> dict[Attention, GraphAnalysis]:
    return {attention: analyze_mlpackage(path) for attention, path in packages.items()}


def test_the_replicated_kv_is_the_whole_difference(analyses) -> None:
    a, b = analyses[Attention.repeat_kv], analyses[Attention.folded]
    diff = diff_analyses(a, b, labels=("repeat_kv", "folded"))
    assert (diff.a, diff.b) == ("repeat_kv", "folded")
    assert len(diff.redundant_only_in_a) == 2 * LAYERS and diff.redundant_only_in_b == []
    assert {copy.kind for copy in diff.redundant_only_in_a} == {"tile"}
    assert diff.redundant_removed_bytes == 2 * LAYERS * TILE_BYTES
    assert diff.redundant_added_bytes == 0
    moved = diff.bytes_per_token
    assert moved["redundant"].delta == -2 * diff.redundant_removed_bytes  # written and read again
    assert moved["total"].delta == moved["redundant"].delta
    for category in ("weights", "kv_read", "kv_write"):
        assert moved[category].delta == 0
    assert diff.weight_bytes.delta == 0 and diff.state_write_ops.delta == 0
    tile = next(change for change in diff.op_changes if change.op == "tile")
    assert (tile.a, tile.b, tile.delta) == (2 * LAYERS, 0, -2 * LAYERS)
    assert tile in diff.removed_ops
    assert diff.ops_total.delta == sum(change.delta for change in diff.op_changes)
    assert diff.bytes_speedup == pytest.approx(moved["total"].a / moved["total"].b)
    # With the built-in profiles (no dispatch term) the predicted speed-up is the byte ratio.
    assert set(diff.predicted) == set(DEVICE_PROFILES)
    for prediction in diff.predicted.values():
        assert prediction.speedup == pytest.approx(diff.bytes_speedup)


def test_a_dispatch_overhead_moves_the_predicted_speedup(analyses) -> None:
    a, b = analyses[Attention.repeat_kv], analyses[Attention.folded]
    slow_dispatch = DeviceProfile(
        device_class="test", display_name="Test", product_types=(),
        effective_bandwidth_mb_s=50_000.0, dispatch_overhead_us=50.0, source="test",
    )  # fmt: skip
    prediction = diff_analyses(a, b, profiles=[slow_dispatch]).predicted["test"]
    seconds_a = a.bytes_per_token.total / 50e9 + a.dispatch_ops * 50e-6
    seconds_b = b.bytes_per_token.total / 50e9 + b.dispatch_ops * 50e-6
    assert prediction.speedup == pytest.approx(seconds_a / seconds_b)


def test_a_build_against_itself_changes_nothing(analyses) -> None:
    a = analyses[Attention.repeat_kv]
    diff = diff_analyses(a, a)
    assert diff.op_changes == [] and diff.redundant_only_in_a == diff.redundant_only_in_b == []
    assert diff.bytes_speedup == 1.0
    assert all(change.delta == 0 for change in diff.bytes_per_token.values())


def test_copies_are_matched_by_what_they_copy_not_by_name() -> None:
    def copy(name: str, source: str, shape: tuple[int, ...] = (1, 32, 128, 64)) -> RedundantCopy:
        return RedundantCopy(kind="tile", op="tile", name=name, function="main", shape=list(shape),
                             dtype="float16", bytes=1, moved_bytes=2, source_op="read_state",
                             source=source)  # fmt: skip

    left = [copy("tile_0", "key_cache_0"), copy("tile_1", "value_cache_0"), copy("t", "x", (4,))]
    right = [copy("var_9", "value_cache_0"), copy("var_12", "renamed_key_cache")]
    only_left, only_right = _unmatched(left, right)
    # Same source first; the renamed one still pairs on kind, op, shape and dtype.
    assert [item.name for item in only_left] == ["t"] and only_right == []


def test_the_diff_command(packages, tmp_path: Path) -> None:
    a, b = str(packages[Attention.repeat_kv]), str(packages[Attention.folded])
    text = run_cli("diff", a, b)
    assert text.returncode == 0, text.stderr
    assert f"A = {a}" in text.stdout
    assert f"redundant copies only in A: {2 * LAYERS} ops, 2.00 MiB of tensors" in text.stdout
    assert f"{2 * LAYERS} × tile" in text.stdout and "from read_state (key_cache_0" in text.stdout
    assert "speed-up from bytes alone" in text.stdout

    as_json = run_cli("diff", a, b, "--json")
    payload = json.loads(as_json.stdout)
    assert payload["redundant_removed_bytes"] == 2 * LAYERS * TILE_BYTES
    assert set(payload["bytes_per_token"]) == {
        "weights",
        "kv_read",
        "kv_write",
        "redundant",
        "total",
    }

    missing = run_cli("diff", a, str(tmp_path / "nope.mlpackage"))
    assert missing.returncode == 2
    assert missing.stderr.strip().startswith("decodebench diff: error: ")
    assert "does not exist" in missing.stderr and len(missing.stderr.strip().splitlines()) == 1


def test_analyze_prints_the_accounting(packages) -> None:
    result = run_cli("analyze", str(packages[Attention.repeat_kv]))
    assert result.returncode == 0, result.stderr
    assert "bytes per token" in result.stdout and "kv read" in result.stdout
    assert "tile          " in result.stdout and "<- read_state key_cache_0" in result.stdout
    assert "predicted          iphone-17-pro:" in result.stdout
    # The avoidable bytes, before the op histogram: the replicated KV is the fold's, and
    # `decodebench repair` applies it.
    waste = result.stdout[: result.stdout.index("  op histogram")]
    size = 2 * 2 * LAYERS * TILE_BYTES / 2**20
    assert (
        f"    tiles and repeats: {2 * LAYERS} tile / repeat copies of the KV cache: "
        f"{size:,.2f} MiB/token" in waste
    )
    assert "fix (decodebench repair applies it): fold the query" in waste
    after = [line for line in waste.splitlines() if "predicted tok/s after the fix: " in line]
    assert after and all(f"{device} " in after[0] for device in DEVICE_PROFILES)
    payload = json.loads(run_cli("analyze", str(packages[Attention.folded]), "--json").stdout)
    assert payload["redundant_ops"] == []
    assert set(payload["predicted_tok_s"]) == set(DEVICE_PROFILES)
    assert "tiles and repeats" not in {item["kind"] for item in payload["waste"]}
    replicated = json.loads(run_cli("analyze", str(packages[Attention.repeat_kv]), "--json").stdout)
    tiles = next(item for item in replicated["waste"] if item["kind"] == "tiles and repeats")
    assert tiles["bytes_per_token"] == 2 * 2 * LAYERS * TILE_BYTES and tiles["applicable"]
    # With the tiles gone, the prediction is the folded build's: same weights, same KV.
    assert tiles["predicted_tok_s_after"] == pytest.approx(payload["predicted_tok_s"])
