"""Graph analysis of small MIL programs written op by op, so every byte is known in advance.

Each program is built with coremltools' MIL builder and saved with no optimisation pass, so
the saved graph is exactly the one written here.
"""

from __future__ import annotations

import logging
from pathlib import Path

import coremltools as ct
import numpy as np
import pytest
from coremltools.converters.mil import Builder as mb
from coremltools.converters.mil.mil import types
from coremltools.proto import Model_pb2

from decodebench.analysis.analyze import analyze_mlpackage
from decodebench.analysis.copies import LARGE_TRANSPOSE_BYTES
from decodebench.contracts.profiles import IPHONE_17_PRO
from decodebench.formats.coreml.known_ops import KNOWN_OPS

logging.getLogger("coremltools").setLevel(logging.ERROR)

FP16 = 2
MIB = 1024**2


def save(program, path: Path, target=ct.target.iOS18) -> Path:
    model = ct.convert(
        program,
        convert_to="mlprogram",
        minimum_deployment_target=target,
        skip_model_load=True,
        pass_pipeline=ct.PassPipeline.EMPTY,
    )
    model.save(str(path))
    return path


def fp16(*shape: int) -> np.ndarray:
    return (np.random.default_rng(0).standard_normal(shape) * 0.02).astype(np.float16)


def test_constexpr_weights_count_at_their_stored_width(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)

    @mb.program(
        input_specs=[mb.TensorSpec(shape=(1, 64), dtype=types.fp16)], opset_version=ct.target.iOS18
    )
    def program(x):
        # int8 per output channel: data [128, 64] int8 + one fp16 scale per row.
        w8 = mb.constexpr_blockwise_shift_scale(
            data=rng.integers(-127, 128, (128, 64)).astype(np.int8),
            scale=np.ones((128, 1), np.float16),
            name="w8",
        )
        # int4 per block of 32 inputs, asymmetric: data, scale and int4 offset per block.
        w4 = mb.constexpr_blockwise_shift_scale(
            data=rng.integers(-8, 8, (64, 128)).astype(types.np_int4_dtype),
            scale=np.ones((64, 4), np.float16),
            offset=np.zeros((64, 4), types.np_int4_dtype),
            name="w4",
        )
        # 6-bit palettized: a uint6 index per element and a 64-entry fp16 lookup table.
        w6 = mb.constexpr_lut_to_dense(
            indices=rng.integers(0, 64, (96, 64)).astype(types.np_uint6_dtype),
            lut=fp16(1, 1, 64, 1),
            name="w6",
        )
        hidden = mb.linear(x=x, weight=w8, name="up")
        hidden = mb.linear(x=hidden, weight=w4, name="down")
        return mb.linear(x=hidden, weight=w6, name="head")

    analysis = analyze_mlpackage(save(program, tmp_path / "quantized.mlpackage"))
    int8_bytes, int8_scales = 128 * 64, 128 * FP16
    int4_bytes, int4_scales, int4_offsets = 64 * 128 // 2, 64 * 4 * FP16, 64 * 4 // 2
    uint6_bytes, lut_bytes = 96 * 64 * 6 // 8, 64 * FP16
    biases = (128 + 64 + 96) * FP16  # the builder gives each linear a zero fp16 bias
    assert analysis.weight_bytes_by_encoding == {
        "constexpr_blockwise_shift_scale": int8_bytes + int8_scales + int4_bytes + int4_scales
        + int4_offsets,
        "constexpr_lut_to_dense": uint6_bytes + lut_bytes,
        "dense": biases,
    }  # fmt: skip
    assert analysis.weight_bytes_by_dtype == {
        "int8": int8_bytes,
        "int4": int4_bytes + int4_offsets,
        "uint6": uint6_bytes,
        "float16": int8_scales + int4_scales + lut_bytes + biases,
    }
    stored = sum(analysis.weight_bytes_by_dtype.values())
    assert analysis.weight_bytes == stored
    assert analysis.bytes_per_token.weights == stored  # every weight is read whole by a linear
    assert analysis.weight_bytes <= analysis.weight_file_bytes
    assert analysis.dispatch_ops == 3  # the constexpr ops run once, at load


def test_ios16_affine_dequantize_keeps_its_weights_in_attributes(tmp_path: Path) -> None:
    @mb.program(
        input_specs=[mb.TensorSpec(shape=(1, 64), dtype=types.fp32)], opset_version=ct.target.iOS16
    )
    def program(x):
        weight = mb.constexpr_affine_dequantize(
            quantized_data=np.arange(128 * 64, dtype=np.uint8).reshape(128, 64),
            zero_point=np.full(128, 128, np.uint8),
            scale=np.ones(128, np.float32),
            axis=0,
            name="weight",
        )
        return mb.linear(x=x, weight=weight, name="out")

    analysis = analyze_mlpackage(save(program, tmp_path / "ios16.mlpackage", ct.target.iOS16))
    expected = 128 * 64 + 128 + 128 * 4
    bias = 128 * 4  # the builder's zero fp32 bias of the linear
    assert analysis.weight_bytes == expected + bias
    assert analysis.weight_bytes_by_encoding == {
        "constexpr_affine_dequantize": expected,
        "dense": bias,
    }
    assert analysis.bytes_per_token.weights == expected + bias


def test_a_weight_only_gathered_is_read_for_its_rows(tmp_path: Path) -> None:
    @mb.program(
        input_specs=[mb.TensorSpec(shape=(3,), dtype=types.int32)], opset_version=ct.target.iOS18
    )
    def program(token_ids):
        table = mb.const(val=fp16(1000, 64), name="embedding")
        tied = mb.const(val=fp16(500, 64), name="tied_embedding")
        rows = mb.gather(x=table, indices=token_ids, axis=0, name="rows")  # [3, 64]
        hidden = mb.gather(x=tied, indices=token_ids, axis=0, name="tied_rows")
        logits = mb.linear(x=mb.add(x=rows, y=hidden), weight=tied, name="logits")
        return logits

    analysis = analyze_mlpackage(save(program, tmp_path / "gather.mlpackage"))
    bias = 500 * FP16  # the builder's zero bias of the linear
    assert analysis.weight_bytes == (1000 + 500) * 64 * FP16 + bias
    # The untied table is read for three rows; the tied one whole, for the output projection.
    assert analysis.bytes_per_token.weights == 3 * 64 * FP16 + 500 * 64 * FP16 + bias


def test_each_kind_of_redundant_copy_is_found_with_its_source(tmp_path: Path) -> None:
    big = (1, 8, 256, 64)  # 256 KiB in fp16
    large = (1, 8, 1024, 128)  # 2 MiB: its transpose leaves on-chip memory

    @mb.program(
        input_specs=[
            mb.TensorSpec(shape=big, dtype=types.fp16),
            mb.TensorSpec(shape=large, dtype=types.fp16),
            mb.TensorSpec(shape=(1, 1, 64), dtype=types.fp16),
        ],
        opset_version=ct.target.iOS18,
    )
    def program(keys, wide, row):
        tiled = mb.tile(x=mb.expand_dims(x=keys, axes=[2]), reps=[1, 1, 4, 1, 1], name="tiled")
        repeated = mb.concat(
            values=[mb.expand_dims(x=keys, axes=[0]), mb.expand_dims(x=keys, axes=[0])],
            axis=0,
            name="repeated",
        )
        heads = np.repeat(np.arange(8, dtype=np.int32), 2)  # each KV head twice
        gathered = mb.gather(x=keys, indices=heads, axis=1, name="dup")
        broadcast = mb.add(x=row, y=np.zeros((1, 16, 1), np.float16), name="broadcast")
        moved = mb.transpose(x=wide, perm=[0, 2, 1, 3], name="moved")
        # Not copies: a transpose that only moves a size-1 axis, a small transpose, a concat of
        # two different tensors, an add of a real bias.
        view = mb.transpose(x=wide, perm=[1, 0, 2, 3], name="view")
        small = mb.transpose(x=keys, perm=[0, 2, 1, 3], name="small")
        joined = mb.concat(values=[keys, mb.mul(x=keys, y=np.float16(2.0))], axis=1, name="joined")
        biased = mb.add(x=row, y=fp16(1, 16, 1), name="biased")
        return tiled, repeated, gathered, broadcast, moved, view, small, joined, biased

    analysis = analyze_mlpackage(save(program, tmp_path / "copies.mlpackage"))
    found = {copy.name: copy for copy in analysis.redundant_ops}
    assert set(found) == {"tiled", "repeated", "dup", "broadcast", "moved"}
    big_bytes = 8 * 256 * 64 * FP16
    expected = {
        "tiled": ("tile", [1, 8, 4, 256, 64], 4 * big_bytes, "input", "keys"),
        "repeated": ("repeat_concat", [2, 1, 8, 256, 64], 2 * big_bytes, "input", "keys"),
        "dup": ("repeat_gather", [1, 16, 256, 64], 2 * big_bytes, "input", "keys"),
        "broadcast": ("broadcast", [1, 16, 64], 16 * 64 * FP16, "input", "row"),
        "moved": ("transpose", [1, 1024, 8, 128], 8 * 1024 * 128 * FP16, "input", "wide"),
    }
    for name, (kind, shape, size, source_op, source) in expected.items():
        copy = found[name]
        assert (copy.kind, copy.shape, copy.bytes) == (kind, shape, size), name
        assert (copy.source_op, copy.source, copy.moved_bytes) == (source_op, source, 2 * size)
        assert copy.dtype == "float16" and copy.function == "main"
    assert 8 * 1024 * 128 * FP16 >= LARGE_TRANSPOSE_BYTES > big_bytes
    total = sum(size for _, _, size, _, _ in expected.values())
    assert analysis.redundant_output_bytes == total
    assert analysis.bytes_per_token.redundant == 2 * total
    assert analysis.tile_ops == 1 and analysis.tile_output_bytes == 4 * big_bytes


def test_kv_cache_states_reads_and_slice_writes(tmp_path: Path) -> None:
    cache = (1, 8, 256, 64)

    @mb.program(
        input_specs=[
            mb.StateTensorSpec(shape=cache, dtype=types.fp16),
            mb.TensorSpec(shape=(1, 8, 1, 64), dtype=types.fp16),
            mb.TensorSpec(shape=(1, 8, 4, 64), dtype=types.fp16),
        ],
        opset_version=ct.target.iOS18,
    )
    def program(key_cache, new_key, query):
        before = mb.read_state(input=key_cache)
        updated = mb.slice_update(
            x=before, update=new_key, begin=[0, 0, 5, 0], end=[1, 8, 6, 64], name="write_k"
        )
        mb.coreml_update_state(state=key_cache, value=updated)
        keys = mb.read_state(input=key_cache)
        return mb.matmul(x=query, y=keys, transpose_y=True, name="scores")

    analysis = analyze_mlpackage(save(program, tmp_path / "stateful.mlpackage"))
    state_bytes = 8 * 256 * 64 * FP16
    moved = analysis.bytes_per_token
    assert analysis.kv_source == "states"
    assert (analysis.state_bytes, moved.kv_read) == (state_bytes, state_bytes)
    assert (moved.kv_positions, moved.kv_read_per_position) == (256, 8 * 64 * FP16)
    assert analysis.kv_read_at(0) == 8 * 64 * FP16
    assert analysis.kv_read_at(99) == 100 * 8 * 64 * FP16
    assert analysis.kv_read_at(10_000) == state_bytes
    assert analysis.state_write_ops == 1
    assert analysis.state_write_bytes == moved.kv_write == 8 * 64 * FP16  # the slice, not the state
    assert moved.total == moved.kv_read + moved.kv_write
    assert analysis.predicted_tok_s([IPHONE_17_PRO]) == {
        "iphone-17-pro": pytest.approx(55_900e6 / moved.total)
    }


def test_a_cache_passed_as_inputs_and_outputs_is_kv_traffic(tmp_path: Path) -> None:
    past = (1, 8, 128, 64)

    @mb.program(
        input_specs=[
            mb.TensorSpec(shape=past, dtype=types.fp16),
            mb.TensorSpec(shape=(1, 8, 1, 64), dtype=types.fp16),
        ],
        opset_version=ct.target.iOS18,
    )
    def program(past_key_0, step):
        present = mb.concat(values=[past_key_0, step], axis=2, name="present_key_0")
        return present

    analysis = analyze_mlpackage(save(program, tmp_path / "stateless.mlpackage"))
    assert analysis.kv_source == "inputs"
    assert analysis.bytes_per_token.kv_read == 8 * 128 * 64 * FP16
    assert analysis.bytes_per_token.kv_write == 8 * 129 * 64 * FP16
    assert analysis.redundant_ops == []  # appending is not a repeat


def _two_function_package(tmp_path: Path) -> Path:
    shape = (1, 8, 256, 64)

    @mb.program(
        input_specs=[mb.TensorSpec(shape=shape, dtype=types.fp16)], opset_version=ct.target.iOS18
    )
    def decode(x):
        return mb.mul(x=x, y=np.float16(2.0), name="y")

    @mb.program(
        input_specs=[mb.TensorSpec(shape=shape, dtype=types.fp16)], opset_version=ct.target.iOS18
    )
    def prefill(x):
        return mb.tile(x=x, reps=[1, 2, 1, 1], name="y")

    paths = [save(program, tmp_path / f"{name}.mlpackage") for name, program in (
        ("decode", decode), ("prefill", prefill))]  # fmt: skip
    descriptor = ct.utils.MultiFunctionDescriptor()
    descriptor.add_function(str(paths[0]), "main", "decode")
    descriptor.add_function(str(paths[1]), "main", "prefill")
    descriptor.default_function_name = "prefill"
    target = tmp_path / "both.mlpackage"
    ct.utils.save_multifunction(descriptor, str(target))
    return target


def test_ops_per_function_and_bytes_of_the_decode_function(tmp_path: Path) -> None:
    analysis = analyze_mlpackage(_two_function_package(tmp_path))
    assert analysis.functions == ["decode", "prefill"]
    assert analysis.decode_function == "decode"  # by name, over the default function
    assert analysis.function_ops["decode"].op_counts.get("mul") == 1
    assert analysis.function_ops["prefill"].op_counts.get("tile") == 1
    assert analysis.function_ops["decode"].dispatch_ops == 1
    assert analysis.op_counts["tile"] == analysis.tile_ops == 1  # the histogram spans both
    assert analysis.redundant_ops == []  # but a decoded token runs only `decode`
    assert analysis.ops_total == sum(ops.ops_total for ops in analysis.function_ops.values())


def test_unknown_ops_are_counted_and_listed(tmp_path: Path) -> None:
    @mb.program(
        input_specs=[mb.TensorSpec(shape=(4, 64), dtype=types.fp16)], opset_version=ct.target.iOS18
    )
    def program(x):
        return mb.relu(x=x, name="y")

    package = save(program, tmp_path / "custom.mlpackage")
    model_file = package / "Data/com.apple.CoreML/model.mlmodel"
    spec = Model_pb2.Model.FromString(model_file.read_bytes())
    block = spec.mlProgram.functions["main"].block_specializations["CoreML8"]
    for operation in block.operations:
        if operation.type == "relu":
            operation.type = "vendor_fused_attention"
    block.operations.add(type="vendor_fused_attention")
    model_file.write_bytes(spec.SerializeToString())

    analysis = analyze_mlpackage(package)
    assert analysis.unknown_ops == {"vendor_fused_attention": 2}
    assert analysis.op_counts["vendor_fused_attention"] == 2
    assert analysis.dispatch_ops == 2


def test_a_program_that_moves_nothing_predicts_nothing(tmp_path: Path) -> None:
    @mb.program(
        input_specs=[mb.TensorSpec(shape=(4,), dtype=types.fp16)], opset_version=ct.target.iOS18
    )
    def program(x):
        return mb.relu(x=x, name="y")

    analysis = analyze_mlpackage(save(program, tmp_path / "tiny.mlpackage"))
    assert analysis.bytes_per_token.total == 0
    assert analysis.predicted_tok_s() == {}
    assert analysis.model_dump(mode="json")["predicted_tok_s"] == {}


def test_known_ops_cover_the_installed_coremltools() -> None:
    from coremltools.converters.mil.mil import ops  # noqa: F401  (registers every op)
    from coremltools.converters.mil.mil.ops.registry import SSAOpRegistry

    registered = set(SSAOpRegistry.core_ops) - {"_const_symbolic"}
    assert registered <= KNOWN_OPS, sorted(registered - KNOWN_OPS)
