"""Graph analysis of real converted packages (tiny-gqa, both attention layouts).

Every category of bytes moved per token is checked against a value computed by hand from the
model's shape.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from coremltools.proto import MIL_pb2, Model_pb2

from decodebench.analysis.analyze import AnalysisError, analyze_mlpackage
from decodebench.building.build import (
    PACKAGE_NAME,
    REPORT_NAME,
    build_variant,
    load_report,
    toolchain_versions,
)
from decodebench.building.job import STAGE_WEIGHTS
from decodebench.contracts.build import BuildReport
from decodebench.contracts.domain import Attention, VariantSpec
from decodebench.contracts.presets import TINY_GQA
from decodebench.contracts.profiles import DEVICE_PROFILES, IPHONE_17_PRO, DeviceProfile
from decodebench.contracts.variants import build_key
from decodebench.modeling import build_model, parameter_count

pytestmark = pytest.mark.slow

CONTEXT = 128
FP16_BYTES = 2
LAYERS = TINY_GQA.num_layers
QUERY_HEADS = TINY_GQA.num_attention_heads
KV_HEADS = TINY_GQA.num_key_value_heads
HEAD_DIM = TINY_GQA.head_dim


class Built:
    def __init__(self, directory: Path, report: BuildReport, progress: list[tuple[str, float]]):
        self.directory = directory
        self.report = report
        self.progress = progress

    @property
    def package(self) -> Path:
        return self.directory / PACKAGE_NAME


def _build(root: Path, attention: Attention) -> Built:
    events: list[tuple[str, float]] = []
    variant = VariantSpec(attention=attention, context=CONTEXT)
    directory = root / attention.value
    report = build_variant(
        TINY_GQA.name, variant, directory, progress=lambda stage, done: events.append((stage, done))
    )
    return Built(directory, report, events)


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory) -> dict[Attention, Built]:
    root = tmp_path_factory.mktemp("builds")
    return {attention: _build(root, attention) for attention in Attention}


def test_repeat_kv_has_one_tile_per_layer_for_k_and_v(builds: dict[Attention, Built]) -> None:
    analysis = analyze_mlpackage(builds[Attention.repeat_kv].package)
    assert analysis.tile_ops == 2 * LAYERS
    assert analysis.tile_output_bytes == 2 * LAYERS * QUERY_HEADS * CONTEXT * HEAD_DIM * FP16_BYTES
    assert {tuple(tile.shape) for tile in analysis.tiles} == {
        (1, KV_HEADS, QUERY_HEADS // KV_HEADS, CONTEXT, HEAD_DIM)
    }
    assert analysis.bytes_per_token.redundant == 2 * analysis.tile_output_bytes


def test_folded_has_no_tiles(builds: dict[Attention, Built]) -> None:
    analysis = analyze_mlpackage(builds[Attention.folded].package)
    assert analysis.tile_ops == 0
    assert analysis.tile_output_bytes == 0
    assert analysis.tiles == []
    assert analysis.bytes_per_token.redundant == 0
    assert "tile" not in analysis.op_counts


def test_states_and_their_writes(builds: dict[Attention, Built]) -> None:
    for built in builds.values():
        analysis = built.report.analysis
        assert analysis.state_bytes == 2 * LAYERS * KV_HEADS * CONTEXT * HEAD_DIM * FP16_BYTES
        assert len(analysis.states) == 2 * LAYERS
        assert analysis.slice_update_ops == 2 * LAYERS
        assert analysis.state_write_ops == 2 * LAYERS
        # Each write changes one token's K or V of one layer, not the whole state.
        assert analysis.bytes_per_token.kv_write == 2 * LAYERS * KV_HEADS * HEAD_DIM * FP16_BYTES
        assert analysis.bytes_per_token.kv_read == analysis.state_bytes


def test_weight_bytes_match_the_parameters_and_the_file(builds: dict[Attention, Built]) -> None:
    parameters = parameter_count(build_model(TINY_GQA, CONTEXT))
    rope_tables = 2 * CONTEXT * HEAD_DIM * FP16_BYTES
    expected = parameters * FP16_BYTES + rope_tables
    weights_file = builds[Attention.folded].package / "Data/com.apple.CoreML/weights/weight.bin"
    for built in builds.values():
        analysis = built.report.analysis
        # coremltools adds small zero-bias constants to every linear layer.
        assert expected <= analysis.weight_bytes <= expected * 1.01
        assert analysis.weight_file_bytes == weights_file.stat().st_size
        assert analysis.weight_bytes <= analysis.weight_file_bytes <= analysis.weight_bytes * 1.01
    assert (
        builds[Attention.folded].report.analysis.weight_bytes
        == builds[Attention.repeat_kv].report.analysis.weight_bytes
    )


def test_bytes_per_token_and_prediction(builds: dict[Attention, Built]) -> None:
    predictions = {}
    for attention, built in builds.items():
        analysis = built.report.analysis
        moved = analysis.bytes_per_token
        assert moved.total == moved.weights + moved.kv_read + moved.kv_write + moved.redundant
        assert sum(analysis.op_counts.values()) == analysis.ops_total
        assert analysis.non_const_ops == analysis.ops_total - analysis.op_counts["const"]
        assert analysis.predict(IPHONE_17_PRO) == pytest.approx(
            IPHONE_17_PRO.effective_bandwidth_bytes_s / moved.total
        )
        predictions[attention] = analysis.predicted_tok_s()
        assert set(predictions[attention]) == set(DEVICE_PROFILES)
    for device_class in DEVICE_PROFILES:
        assert (
            predictions[Attention.folded][device_class]
            > predictions[Attention.repeat_kv][device_class]
        )


def test_each_category_matches_the_hand_computed_bytes(builds: dict[Attention, Built]) -> None:
    kv_slice = LAYERS * 2 * KV_HEADS * HEAD_DIM * FP16_BYTES  # one position of every K and V
    rope_tables = 2 * CONTEXT * HEAD_DIM * FP16_BYTES  # cos and sin, gathered one row each
    tile_bytes = QUERY_HEADS * CONTEXT * HEAD_DIM * FP16_BYTES  # one replicated K or V
    for attention, built in builds.items():
        analysis = built.report.analysis
        moved = analysis.bytes_per_token
        assert moved.weights == analysis.weight_bytes - rope_tables + 2 * HEAD_DIM * FP16_BYTES
        assert moved.kv_read == CONTEXT * kv_slice
        assert (moved.kv_read_per_position, moved.kv_positions) == (kv_slice, CONTEXT)
        assert analysis.kv_read_at(15) == 16 * kv_slice
        assert moved.kv_write == analysis.state_write_bytes == kv_slice
        copies = analysis.redundant_ops
        if attention == Attention.repeat_kv:
            assert len(copies) == 2 * LAYERS
            assert moved.redundant == 2 * 2 * LAYERS * tile_bytes  # written, then read again
            assert sorted(copy.source for copy in copies) == sorted(
                f"{kind}_cache_{layer}" for kind in ("key", "value") for layer in range(LAYERS)
            )
            assert {(copy.kind, copy.source_op, copy.bytes) for copy in copies} == {
                ("tile", "read_state", tile_bytes)
            }
        else:
            assert copies == [] and moved.redundant == 0
        assert moved.total == moved.weights + moved.kv_read + moved.kv_write + moved.redundant
        assert analysis.dispatch_ops == analysis.ops_total - analysis.op_counts["const"]
        assert analysis.unknown_ops == {}
        assert analysis.functions == ["main"] and analysis.decode_function == "main"


def test_prediction_adds_the_dispatch_overhead(builds: dict[Attention, Built]) -> None:
    analysis = builds[Attention.folded].report.analysis
    profile = DeviceProfile(
        device_class="test",
        display_name="Test",
        product_types=(),
        effective_bandwidth_mb_s=1_000.0,
        dispatch_overhead_us=5.0,
        source="test",
    )
    seconds = analysis.bytes_per_token.total / 1e9 + analysis.dispatch_ops * 5e-6
    assert analysis.predict(profile) == pytest.approx(1 / seconds)


def test_json_keeps_the_first_cut_and_adds_the_accounting(builds: dict[Attention, Built]) -> None:
    payload = json.loads(builds[Attention.repeat_kv].report.analysis.model_dump_json())
    first_cut = {"ops_total", "op_counts", "tile_ops", "tile_output_bytes", "tiles",
                 "slice_update_ops", "state_write_ops", "weight_bytes", "state_bytes"}  # fmt: skip
    assert first_cut <= set(payload)
    assert {"weights", "kv_read", "kv_write", "redundant", "total"} <= set(
        payload["bytes_per_token"]
    )
    assert len(payload["redundant_ops"]) == 2 * LAYERS
    assert {"kind", "name", "shape", "bytes", "source_op", "source"} <= set(
        payload["redundant_ops"][0]
    )
    assert set(payload["predicted_tok_s"]) == set(DEVICE_PROFILES)
    assert payload["predicted_tok_s"]["iphone-17-pro"] == pytest.approx(
        55_900e6 / payload["bytes_per_token"]["total"]
    )


def test_build_report_is_written_and_keyed(builds: dict[Attention, Built]) -> None:
    built = builds[Attention.repeat_kv]
    on_disk = load_report(built.directory)
    assert on_disk == built.report
    assert json.loads((built.directory / REPORT_NAME).read_text())["key"] == built.report.key
    toolchain = toolchain_versions()
    assert set(toolchain) == {"decodebench", "torch", "coremltools", "code"}
    assert built.report.key == build_key(TINY_GQA.name, built.report.variant, toolchain)
    # fp16 builds skip the weight-loading, sensitivity and quantization stages.
    assert {"trace", "convert", "save", "analyse"} <= set(built.report.stage_seconds)
    assert set(built.report.stage_seconds) <= set(STAGE_WEIGHTS)
    assert built.report.peak_rss_bytes > 0
    assert builds[Attention.folded].report.key != built.report.key
    assert not list(built.directory.glob(".saving-*"))


def test_progress_is_monotonic_and_ends_done(builds: dict[Attention, Built]) -> None:
    events = builds[Attention.folded].progress
    fractions = [done for _, done in events]
    assert fractions == sorted(fractions)
    assert fractions[-1] == 1.0
    order = list(STAGE_WEIGHTS)
    stages = [order.index(stage) for stage, _ in events if stage in STAGE_WEIGHTS]
    assert stages == sorted(stages)


def test_layers_override_changes_the_graph(tmp_path: Path) -> None:
    variant = VariantSpec(attention=Attention.repeat_kv, context=64, layers=1)
    report = build_variant(TINY_GQA.name, variant, tmp_path)
    assert report.config.num_layers == 1
    assert report.analysis.tile_ops == 2
    assert report.analysis.state_bytes == 2 * KV_HEADS * 64 * HEAD_DIM * FP16_BYTES


def _copy_package(source: Path, target: Path) -> Path:
    shutil.copytree(source, target)
    return target


def _model_file(package: Path) -> Path:
    return package / "Data/com.apple.CoreML/model.mlmodel"


def test_unknown_and_nested_ops_are_counted(builds: dict[Attention, Built], tmp_path: Path) -> None:
    package = _copy_package(builds[Attention.folded].package, tmp_path / "edited.mlpackage")
    spec = Model_pb2.Model.FromString(_model_file(package).read_bytes())
    function = spec.mlProgram.functions["main"]
    block = function.block_specializations[function.opset]
    outer = block.operations.add(type="mystery_op")
    inner_block = outer.blocks.add()
    inner_block.operations.add(type="inner_mystery")
    tile = inner_block.operations.add(type="tile")
    output = tile.outputs.add(name="nested_tile_out")
    output.type.tensorType.dataType = MIL_pb2.DataType.FLOAT16
    for size in (2, 3):
        output.type.tensorType.dimensions.add().constant.size = size
    _model_file(package).write_bytes(spec.SerializeToString())

    before = builds[Attention.folded].report.analysis
    after = analyze_mlpackage(package)
    assert after.op_counts["mystery_op"] == 1
    assert after.op_counts["inner_mystery"] == 1
    assert after.ops_total == before.ops_total + 3
    assert after.tile_ops == 1
    assert after.tile_output_bytes == 2 * 3 * FP16_BYTES


def test_bad_paths_raise_analysis_error(builds: dict[Attention, Built], tmp_path: Path) -> None:
    with pytest.raises(AnalysisError, match="is not an .mlpackage: the path does not exist"):
        analyze_mlpackage(tmp_path / "missing.mlpackage")

    a_file = tmp_path / "file.mlpackage"
    a_file.write_text("not a package")
    with pytest.raises(AnalysisError, match="is not an .mlpackage: it is a file"):
        analyze_mlpackage(a_file)

    with pytest.raises(AnalysisError, match="Manifest.json is missing"):
        analyze_mlpackage(tmp_path)

    no_model = _copy_package(builds[Attention.folded].package, tmp_path / "no-model.mlpackage")
    _model_file(no_model).unlink()
    with pytest.raises(AnalysisError, match="root model Data/com.apple.CoreML/model.mlmodel"):
        analyze_mlpackage(no_model)

    bad_manifest = _copy_package(builds[Attention.folded].package, tmp_path / "manifest.mlpackage")
    (bad_manifest / "Manifest.json").write_text("{}")
    with pytest.raises(AnalysisError, match="Manifest.json names no root model"):
        analyze_mlpackage(bad_manifest)

    garbage = _copy_package(builds[Attention.folded].package, tmp_path / "garbage.mlpackage")
    _model_file(garbage).write_bytes(b"\xff\xfe not a protobuf")
    with pytest.raises(AnalysisError, match="is not a Core ML model spec"):
        analyze_mlpackage(garbage)

    neural_network = _copy_package(builds[Attention.folded].package, tmp_path / "nn.mlpackage")
    spec = Model_pb2.Model(specificationVersion=4)
    spec.neuralNetwork.SetInParent()
    _model_file(neural_network).write_bytes(spec.SerializeToString())
    with pytest.raises(AnalysisError, match="is not an mlprogram: its model type is neuralNetwork"):
        analyze_mlpackage(neural_network)
