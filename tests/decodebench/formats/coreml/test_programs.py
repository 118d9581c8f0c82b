"""The reference interpreter on whole converted programs: the project's tiny build against the
PyTorch model it came from, and the same build with 4-bit compressed weights."""

from __future__ import annotations

from pathlib import Path

import coremltools as ct
import coremltools.optimize.coreml as cto
import numpy as np
import pytest
from coremltools.converters.mil import Builder as mb
from coremltools.converters.mil.mil import Program

from decodebench.building.build import PACKAGE_NAME, build_variant
from decodebench.contracts.domain import Attention, VariantSpec
from decodebench.contracts.presets import TINY_GQA
from decodebench.formats.coreml.interpreter import Interpreter, numpy_dtype
from decodebench.formats.coreml.program import MilError, load_package, quiet_coremltools
from decodebench.formats.coreml.verify import open_session
from decodebench.modeling import build_model, greedy_decode, step_inputs
from tests.support.mil import decompression_oracles

pytestmark = pytest.mark.slow

CONTEXT = 64


@pytest.fixture(scope="module")
def tiny_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("tiny")
    with quiet_coremltools():
        build_variant(
            TINY_GQA.name, VariantSpec(attention=Attention.repeat_kv, context=CONTEXT), directory
        )
    return directory / PACKAGE_NAME


def test_converted_program_matches_its_pytorch_model(tiny_build: Path) -> None:
    model = build_model(TINY_GQA, CONTEXT, Attention.repeat_kv)  # fp32: the reference
    prompt, steps = [3, 1, 4, 1, 5], 6
    expected_tokens, expected_logits = greedy_decode(model, prompt, steps)
    session = open_session(tiny_build)
    token, tokens = prompt[0], []
    for position, reference in enumerate(expected_logits):
        logits = session.step(token, position)
        # fp16 storage of every intermediate vs an fp32 model: a few 1e-3 on logits of ~1.
        np.testing.assert_allclose(logits, reference.numpy(), atol=1e-2)
        token = prompt[position + 1] if position + 1 < len(prompt) else int(np.argmax(logits))
        if position + 1 >= len(prompt):
            tokens.append(token)
    assert tokens == expected_tokens


def test_compressed_weights_decompress_like_coremltools(tiny_build: Path, tmp_path: Path) -> None:
    with quiet_coremltools(), np.errstate(all="ignore"):
        model = ct.models.MLModel(str(tiny_build), skip_model_load=True)
        int4 = cto.linear_quantize_weights(
            model,
            cto.OptimizationConfig(
                global_config=cto.OpLinearQuantizerConfig(
                    mode="linear_symmetric", dtype="int4", granularity="per_block", block_size=32
                )
            ),
        )
        lut = cto.palettize_weights(
            model,
            cto.OptimizationConfig(
                global_config=cto.OpPalettizerConfig(
                    mode="uniform", nbits=4, granularity="per_grouped_channel", group_size=16
                )
            ),
        )
    reference = open_session(tiny_build)
    for name, compressed in (("int4", int4), ("lut4", lut)):
        path = tmp_path / f"{name}.mlpackage"
        compressed.save(str(path))
        package = load_package(path)
        assert decompression_oracles(package.program) > 10
        # The same program with every constexpr replaced by coremltools' dense value must
        # compute exactly what the interpreter computes from the compressed form.
        dense = load_package(path).program
        _densify(dense)
        compressed_run, dense_run = Interpreter(package.program), Interpreter(dense)
        states_compressed, states_dense = compressed_run.new_states(), dense_run.new_states()
        for position, token in enumerate([3, 1, 4]):
            ids, position_input, mask = step_inputs(token, position, CONTEXT)
            feed = {
                "input_ids": ids.numpy(),
                "position": position_input.numpy(),
                "causal_mask": mask.numpy(),
            }
            got = compressed_run.run(feed, states_compressed)["logits"]
            np.testing.assert_array_equal(got, dense_run.run(feed, states_dense)["logits"])
            reference.reset()
        assert not np.array_equal(got, reference.step(4, 0))  # 4-bit weights do change logits


def _densify(program: Program) -> None:
    function = program.functions["main"]
    with function:
        for op in list(function.operations):
            if op.op_type.startswith("constexpr_"):
                value = op.materialized_val_inference().astype(numpy_dtype(op.outputs[0].dtype))
                dense = mb.const(val=value, before_op=op)
                function.replace_uses_of_var_after_op(
                    anchor_op=op, old_var=op.outputs[0], new_var=dense, force_replace=True
                )
                function.remove_ops([op])


def test_function_and_input_errors_on_a_real_package(tiny_build: Path) -> None:
    package = load_package(tiny_build)
    with pytest.raises(MilError, match="has no function 'decode'"):
        Interpreter(package.program, function="decode")
    interpreter = Interpreter(package.program)
    ids, position, mask = step_inputs(1, 0, CONTEXT)
    with pytest.raises(MilError, match="no storage for states"):
        interpreter.run(
            {"input_ids": ids.numpy(), "position": position.numpy(), "causal_mask": mask.numpy()},
            {},
        )
