"""`decodebench verify` and `decodebench fold` from the command line, and decode-input
recognition for programs whose interface the project did not choose."""

from __future__ import annotations

import json
from pathlib import Path

import coremltools as ct
import numpy as np
import pytest
from coremltools.converters.mil import Builder as mb
from coremltools.converters.mil.mil import types

from decodebench.building.build import PACKAGE_NAME, build_variant
from decodebench.cli import main
from decodebench.contracts.domain import Attention, VariantSpec
from decodebench.contracts.presets import TINY_GQA
from decodebench.formats.coreml.inputs import InputMapping, recognise, step_feed
from decodebench.formats.coreml.interpreter import Interpreter
from decodebench.formats.coreml.program import MilError, load_package, quiet_coremltools

pytestmark = pytest.mark.slow

CONTEXT = 64


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("verify")
    paths = {}
    with quiet_coremltools():
        for name, attention, layers in (
            ("repeat_kv", Attention.repeat_kv, 1),
            ("folded", Attention.folded, 1),
            ("two_layers", Attention.folded, 2),
        ):
            variant = VariantSpec(attention=attention, context=CONTEXT, layers=layers)
            build_variant(TINY_GQA.name, variant, root / name)
            paths[name] = root / name / PACKAGE_NAME
        # The same program behind other input names, as a third-party converter might emit it.
        model = ct.models.MLModel(str(paths["folded"]), skip_model_load=True)
        spec = model.get_spec()
        for old, new in (("input_ids", "tok"), ("position", "step_index"), ("causal_mask", "bias")):
            ct.utils.rename_feature(spec, old, new)
        renamed = ct.models.MLModel(spec, weights_dir=model.weights_dir, skip_model_load=True)
        paths["renamed"] = root / "renamed.mlpackage"
        renamed.save(str(paths["renamed"]))
        # Names that lie (the token called "position" and the other way round), in swapped order.
        spec = model.get_spec()
        for old, new in (("input_ids", "t"), ("position", "input_ids"), ("t", "position")):
            ct.utils.rename_feature(spec, old, new)
        for inputs in (spec.description.input, spec.mlProgram.functions["main"].inputs):
            listed = list(inputs)
            del inputs[:]
            inputs.extend([listed[1], listed[0], *listed[2:]])
        swapped = ct.models.MLModel(spec, weights_dir=model.weights_dir, skip_model_load=True)
        paths["swapped"] = root / "swapped.mlpackage"
        swapped.save(str(paths["swapped"]))
    return paths


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_verify_agreeing_programs_exits_0_with_json(packages, capsys) -> None:  # noqa: ANN001
    code, out, _ = run_cli(
        capsys,
        "verify",
        str(packages["repeat_kv"]),
        str(packages["folded"]),
        "--steps",
        "4",
        "--json",
    )
    result = json.loads(out)
    assert code == 0
    assert result["tokens_a"] == result["tokens_b"] and len(result["tokens_a"]) == 4
    assert result["first_divergent_step"] is None
    assert 0 <= result["max_abs_diff"] <= result["atol"]

    code, out, _ = run_cli(
        capsys, "verify", str(packages["repeat_kv"]), str(packages["folded"]), "--steps", "2"
    )
    assert code == 0 and ": AGREE" in out and "tokens a" in out


def test_verify_different_programs_exits_1(packages, capsys) -> None:  # noqa: ANN001
    code, out, _ = run_cli(
        capsys,
        "verify",
        str(packages["folded"]),
        str(packages["two_layers"]),
        "--steps",
        "3",
        "--json",
    )
    result = json.loads(out)
    assert code == 1
    assert result["first_divergent_step"] == 0
    assert result["max_abs_diff"] > result["atol"]


def test_verify_errors_exit_2(packages, capsys, tmp_path: Path) -> None:  # noqa: ANN001
    code, out, err = run_cli(
        capsys, "verify", str(tmp_path / "missing.mlpackage"), str(packages["folded"]), "--json"
    )
    assert code == 2 and "the path does not exist" in err and "error" in json.loads(out)

    code, _, err = run_cli(
        capsys, "verify", str(packages["folded"]), str(packages["folded"]), "--steps", "99"
    )
    assert code == 2 and "exceed the context of 64" in err

    code, _, err = run_cli(
        capsys, "verify", str(packages["folded"]), str(packages["folded"]), "--prompt", "1,x"
    )
    assert code == 2 and "--prompt must be comma-separated integers" in err


def test_inputs_are_recognised_by_their_dataflow(packages, capsys, tmp_path: Path) -> None:  # noqa: ANN001
    """Uninformative names (tok, step_index: both int32 [1]), and names that lie in swapped
    order: the token is the input indexing the vocabulary-sized embedding, whatever its name."""
    for name, token, position, mask in (
        ("renamed", "tok", "step_index", "bias"),
        ("swapped", "position", "input_ids", "causal_mask"),
    ):
        code, out, _ = run_cli(
            capsys, "verify", str(packages["folded"]), str(packages[name]), "--json"
        )
        result = json.loads(out)
        assert code == 0, result
        interface = result["interface_b"]
        assert (interface["token"], interface["position"], interface["mask"]) == (
            token,
            position,
            mask,
        )
        assert result["max_abs_diff"] == 0.0
    with quiet_coremltools():
        interpreter = Interpreter(load_package(packages["swapped"]).program)
    assert list(interpreter.inputs)[:2] == ["input_ids", "position"]

    # A mapping file still overrides, and its mistakes are reported.
    mapping = tmp_path / "inputs.json"
    mapping.write_text(json.dumps({"b": {"token": "tok", "position": "step_index"}}))
    code, out, _ = run_cli(
        capsys,
        "verify",
        str(packages["folded"]),
        str(packages["renamed"]),
        "--inputs",
        str(mapping),
        "--json",
    )
    result = json.loads(out)
    assert code == 0
    assert result["interface_b"]["mask"] == "bias"
    assert result["max_abs_diff"] == 0.0

    mapping.write_text(json.dumps({"token": "nope"}))
    code, _, err = run_cli(
        capsys,
        "verify",
        str(packages["folded"]),
        str(packages["renamed"]),
        "--inputs",
        str(mapping),
    )
    assert code == 2 and "the mapping names token input 'nope'" in err
    mapping.write_text(json.dumps({"tokens": "x"}))
    code, _, err = run_cli(
        capsys,
        "verify",
        str(packages["folded"]),
        str(packages["renamed"]),
        "--inputs",
        str(mapping),
    )
    assert code == 2 and "tokens: Extra inputs are not permitted" in err


def test_fold_command_writes_the_package_and_reports(packages, capsys, tmp_path: Path) -> None:  # noqa: ANN001
    out_path = tmp_path / "folded.mlpackage"
    code, out, _ = run_cli(capsys, "fold", str(packages["repeat_kv"]), str(out_path))
    assert code == 0 and out_path.is_dir()
    assert "1 found, 1 rewritten, 0 refused" in out and "[rewritten]" in out and "(h // G)" in out

    code, out, _ = run_cli(capsys, "fold", str(packages["repeat_kv"]), str(out_path), "--json")
    report = json.loads(out)
    assert code == 0 and (report["found"], report["rewritten"], report["refused"]) == (1, 1, 0)
    assert report["after"]["tile_ops"] == 0 and report["before"]["tile_ops"] == 2

    code, _, err = run_cli(capsys, "fold", str(tmp_path / "missing"), str(out_path))
    assert code == 2 and "does not exist" in err
    code, _, err = run_cli(capsys, "fold", str(out_path), str(out_path))
    assert code == 2 and "must differ" in err


def test_recognises_a_binary_mask_and_other_names() -> None:
    @mb.program(
        input_specs=[
            mb.TensorSpec((1, 1), types.int32),
            mb.TensorSpec((1,), types.int32),
            mb.TensorSpec((1, 16), types.int32),
            mb.StateTensorSpec((1, 2, 16, 4), types.fp16),
        ],
        opset_version=ct.target.iOS18,
    )
    def step(tokens, cache_position, attention_mask, keys):
        cache = mb.read_state(input=keys)
        visible = mb.cast(x=attention_mask, dtype="fp16")
        summed = mb.reduce_sum(x=cache, axes=[1, 3])
        logits = mb.add(x=mb.mul(x=summed, y=visible), y=mb.cast(x=tokens, dtype="fp16"))
        return mb.add(
            x=logits, y=mb.cast(x=mb.expand_dims(x=cache_position, axes=[0]), dtype="fp16")
        )

    interpreter = Interpreter(step)
    interface = recognise(interpreter)
    assert (interface.token, interface.position, interface.mask) == (
        "tokens",
        "cache_position",
        "attention_mask",
    )
    assert (interface.mask_kind, interface.context, interface.vocab) == ("binary", 16, 16)
    feed = step_feed(interpreter, interface, token=5, position=3)
    np.testing.assert_array_equal(feed["attention_mask"], [[1] * 4 + [0] * 12])
    assert feed["tokens"].tolist() == [[5]] and feed["cache_position"].tolist() == [3]
    with pytest.raises(MilError, match="position 16 outside the context of 16"):
        step_feed(interpreter, interface, token=5, position=16)
    forced = recognise(interpreter, InputMapping(token="cache_position", position="tokens"))
    assert (forced.token, forced.position) == ("cache_position", "tokens")


def test_a_graph_ambiguous_about_the_token_asks_for_a_mapping() -> None:
    """Two integer inputs that both index the vocabulary-sized table: the graph cannot say
    which is the token, so recognition asks for a mapping, and the mapping settles it."""

    @mb.program(
        input_specs=[
            mb.TensorSpec((1,), types.int32),
            mb.TensorSpec((1,), types.int32),
            mb.StateTensorSpec((1, 2, 16, 4), types.fp16),
        ],
        opset_version=ct.target.iOS18,
    )
    def step(a, b, keys):
        table = np.arange(32 * 4, dtype=np.float16).reshape(32, 4)
        rows = mb.add(
            x=mb.gather(x=table, indices=a, axis=0), y=mb.gather(x=table, indices=b, axis=0)
        )
        cache = mb.reduce_sum(x=mb.read_state(input=keys), axes=[0, 1, 2])
        return mb.linear(x=mb.add(x=rows, y=cache), weight=table)

    interpreter = Interpreter(step)
    with pytest.raises(MilError, match=r"ambiguous, 2 inputs act as the token \(a indexes"):
        recognise(interpreter, program="p")
    interface = recognise(interpreter, InputMapping(token="b"))
    assert (interface.token, interface.position, interface.vocab) == ("b", "a", 32)


def test_a_position_table_as_long_as_the_vocabulary_is_not_a_token() -> None:
    """Context equal to the vocabulary: both inputs index a table with vocabulary-many rows, but
    only one of them writes the KV cache, so that one is the position."""

    @mb.program(
        input_specs=[
            mb.TensorSpec((1,), types.int32),
            mb.TensorSpec((1,), types.int32),
            mb.StateTensorSpec((1, 1, 16, 4), types.fp16),
        ],
        opset_version=ct.target.iOS18,
    )
    def step(p, t, keys):
        embed = np.arange(16 * 4, dtype=np.float16).reshape(16, 4)
        rope = np.ones((16, 4), dtype=np.float16)
        row = mb.mul(
            x=mb.gather(x=embed, indices=t, axis=0), y=mb.gather(x=rope, indices=p, axis=0)
        )
        begin = mb.concat(values=[[0, 0], p, [0]], axis=0)
        end = mb.concat(values=[[1, 1], mb.add(x=p, y=1), [4]], axis=0)
        cache = mb.slice_update(x=mb.read_state(input=keys), update=mb.reshape(x=row, shape=[1, 1, 1, 4]),
                                begin=begin, end=end)  # fmt: skip
        written = mb.coreml_update_state(state=keys, value=cache)
        summed = mb.reduce_sum(x=written, axes=[0, 1, 2])
        return mb.linear(x=mb.expand_dims(x=summed, axes=[0]), weight=embed)

    interface = recognise(Interpreter(step))
    assert (interface.token, interface.position, interface.vocab, interface.context) == (
        "t",
        "p",
        16,
        16,
    )
