"""Builds as a service: keys, build.json, the cache, progress, multifunction and KV variants."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from decodebench.analysis.analyze import analyze_mlpackage
from decodebench.building.build import BuildError, build_variant, load_report
from decodebench.building.cache import BuildCache
from decodebench.contracts.domain import VariantSpec
from decodebench.contracts.variants import build_key
from tests.support.cli import run_cli

pytestmark = pytest.mark.slow

CONTEXT = 64


@pytest.fixture(scope="module")
def top1(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("builds")
    cache = BuildCache(root / "cache")
    progress: list[tuple[str, float]] = []
    variant = VariantSpec(context=CONTEXT, quant="top1")
    report = build_variant(
        "tiny-gqa", variant, root / "first", cache=cache,
        progress=lambda stage, fraction: progress.append((stage, fraction)),
    )  # fmt: skip
    return root, cache, variant, report, progress


def test_build_json_records_stages_memory_and_the_ranking(top1) -> None:
    root, _, _, report, progress = top1
    on_disk = load_report(root / "first")
    assert on_disk.key == report.key and not report.cache_hit
    for stage in ("build_model", "sensitivity", "trace", "convert", "quantize", "save", "analyse"):
        assert report.stage_seconds[stage] >= 0, stage
    assert report.peak_rss_bytes > 0 and report.wall_seconds > 0
    quant = report.quant
    assert quant is not None and quant.recipe == "top1"
    assert quant.constexpr_ops == {
        "constexpr_blockwise_shift_scale": 14,
        "constexpr_lut_to_dense": 1,
    }
    ranking = quant.sensitivity.ranking
    assert sorted(item.layer for item in ranking) == [0, 1]
    assert quant.promoted_layers == [ranking[0].layer]
    promoted = ranking[0].layer
    assert quant.weights[f"model.layers.{promoted}.mlp.up_proj.weight"] == "int8"
    assert quant.weights[f"model.layers.{1 - promoted}.mlp.up_proj.weight"] == "int4/32"
    assert quant.weights["model.embed_tokens.weight"] == "lut6"
    stages = [stage for stage, _ in progress]
    assert stages[0] == "build_model" and stages[-1] == "done"
    fractions = [fraction for _, fraction in progress]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0


def test_quantized_package_holds_the_expected_ops_and_bytes(top1) -> None:
    root, _, _, report, _ = top1
    analysis = analyze_mlpackage(root / "first" / "model.mlpackage")
    assert analysis.op_counts["constexpr_blockwise_shift_scale"] == 14
    assert analysis.op_counts["constexpr_lut_to_dense"] == 1
    config = report.config
    hidden, inter, q = (
        config.hidden_size,
        config.intermediate_size,
        config.num_attention_heads * config.head_dim,
    )
    kv = config.num_key_value_heads * config.head_dim
    per_layer = 2 * hidden * q + 2 * hidden * kv + 3 * hidden * inter
    promoted = per_layer  # int8: 1 byte per weight + one fp16 scale per output row
    promoted_scales = 2 * (q + kv + kv + hidden + inter + inter + hidden)
    int4 = per_layer // 2 + 2 * per_layer // 32
    lut = config.vocab_size * hidden * 6 // 8 + 64 * 2
    compressed = promoted + promoted_scales + int4 + lut
    # Norms and RoPE tables stay fp16 (small); the blobs are 64-byte aligned.
    assert compressed <= analysis.weight_bytes < compressed + 200_000


def test_identical_request_is_a_cache_hit(top1, tmp_path: Path) -> None:
    _, cache, variant, report, _ = top1
    started = time.perf_counter()
    again = build_variant(
        "tiny-gqa", VariantSpec(context=CONTEXT, quant="top01"), tmp_path, cache=cache
    )
    assert time.perf_counter() - started < 1.0
    assert again.cache_hit and again.key == report.key
    assert (tmp_path / "model.mlpackage" / "Manifest.json").is_file()
    other = VariantSpec(context=CONTEXT, quant="top1", kv="input")
    assert build_key("tiny-gqa", other, report.toolchain) != report.key


def test_other_variants_of_a_model_reuse_its_measured_ranking(top1, tmp_path: Path) -> None:
    _, cache, _, report, _ = top1
    first = report.quant.sensitivity
    assert first.measured_by is None and first.arithmetic.startswith("bfloat16")
    other = VariantSpec(context=CONTEXT, quant="top1", kv="input", attention="repeat_kv")
    again = build_variant("tiny-gqa", other, tmp_path, cache=cache)
    reused = again.quant.sensitivity
    assert not again.cache_hit and again.key != report.key
    assert reused.measured_by == report.key
    assert reused.ranking == first.ranking and reused.seconds == first.seconds
    assert again.quant.promoted_layers == report.quant.promoted_layers
    # Another base scheme is another measurement.
    differently = VariantSpec(context=CONTEXT, quant="ffn=int4/64,attn=int4,top1")
    measured = build_variant("tiny-gqa", differently, tmp_path / "b", cache=cache)
    assert measured.quant.sensitivity.measured_by is None


def test_old_variants_keep_their_keys() -> None:
    identity = VariantSpec(context=128).graph_identity()
    assert identity == {"attention": "folded", "context": 128, "layers": None, "quant": "fp16"}
    assert VariantSpec.model_validate(identity) == VariantSpec(context=128)


def test_too_many_promoted_layers_name_the_field(tmp_path: Path) -> None:
    with pytest.raises(BuildError, match="quant: top5 promotes more layers than the model's 2"):
        build_variant("tiny-gqa", VariantSpec(context=CONTEXT, quant="top5"), tmp_path)


@pytest.mark.parametrize(
    ("variant", "message"),
    [
        (VariantSpec(context=CONTEXT, quant="top5"), "quant: top5 promotes more layers"),
        (VariantSpec(context=CONTEXT, kv_window=True), "kv_window: tiny-gqa has no sliding"),
    ],
)
def test_a_refused_build_leaves_no_folder_behind(
    tmp_path: Path, variant: VariantSpec, message: str
) -> None:
    out = tmp_path / "new" / "build"
    with pytest.raises(BuildError, match=message):
        build_variant("tiny-gqa", variant, out)
    assert not out.exists()


def test_multifunction_prefill_and_host_kv(tmp_path: Path) -> None:
    variant = VariantSpec(context=CONTEXT, kv="input", prefill_chunk=8, quant="w8")
    report = build_variant("tiny-qwen", variant, tmp_path)
    assert report.functions == ["main", "prefill"]
    analysis = report.analysis
    assert analysis.state_write_ops == 0 and analysis.tile_ops == 0
    # One copy of the weights for both functions.
    single = build_variant(
        "tiny-qwen", variant.model_copy(update={"prefill_chunk": None}), tmp_path / "one"
    )
    assert abs(analysis.weight_file_bytes - single.analysis.weight_file_bytes) < 4096
    from coremltools.proto import Model_pb2

    spec = Model_pb2.Model.FromString(
        (tmp_path / "model.mlpackage/Data/com.apple.CoreML/model.mlmodel").read_bytes()
    )
    functions = {function.name: function for function in spec.description.functions}
    prefill_inputs = {
        feature.name: list(feature.type.multiArrayType.shape)
        for feature in functions["prefill"].input
    }
    assert prefill_inputs["input_ids"] == [1, 8] and "causal_mask" not in prefill_inputs
    outputs = [feature.name for feature in functions["main"].output]
    assert outputs[:3] == ["logits", "key_0", "value_0"]


def test_cli_build_then_hit_and_bad_flags(tmp_path: Path) -> None:
    common = [
        "--preset",
        "tiny-gqa",
        "--context",
        "64",
        "--quant",
        "w4",
        "--cache-dir",
        str(tmp_path / "c"),
    ]
    built = run_cli("build", *common, "--out", str(tmp_path / "a"), "--quiet")
    assert built.returncode == 0, built.stderr
    assert "constexpr_blockwise_shift_scale" in built.stdout
    hit = run_cli("build", *common, "--out", str(tmp_path / "b"))
    assert hit.returncode == 0 and hit.stdout.startswith("cache hit")
    assert json.loads((tmp_path / "b" / "build.json").read_text())["variant"]["quant"] == "w4"
    bad = run_cli(
        "build", "--preset", "tiny-gqa", "--quant", "ffn=int3", "--out", str(tmp_path / "x")
    )
    assert bad.returncode == 2 and "--quant: unknown scheme 'int3'" in bad.stderr
    bad = run_cli(
        "build",
        "--preset",
        "tiny-gqa",
        "--context",
        "64",
        "--prefill-chunk",
        "128",
        "--out",
        str(tmp_path / "x"),
    )
    assert bad.returncode == 2 and "prefill_chunk (128) must not exceed context (64)" in bad.stderr
