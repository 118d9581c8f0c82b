"""The coremltools backend: the converted interface, its stages, and what it leaves behind."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from decodebench.contracts.domain import Attention, VariantSpec
from decodebench.contracts.presets import TINY_GQA
from decodebench.formats.coreml.convert import (
    Conversion,
    ConversionError,
    CoreMLToolsConverter,
    convert,
)
from decodebench.modeling import build_model

pytestmark = pytest.mark.slow

CONTEXT = 64
ONE_LAYER = TINY_GQA.model_copy(update={"num_layers": 1})


class RecordedStages:
    def __init__(self) -> None:
        self.names: list[str] = []

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        self.names.append(name)
        yield


def test_converted_interface_stages_and_cleanup(tmp_path: Path) -> None:
    converter = CoreMLToolsConverter()
    variant = VariantSpec(attention=Attention.folded, context=CONTEXT, layers=1)
    stages = RecordedStages()
    converted = convert(build_model(ONE_LAYER, CONTEXT), ONE_LAYER, variant, stages, converter)
    assert stages.names == ["trace", "convert"]

    description = converted.get_spec().description
    inputs = {
        feature.name: list(feature.type.multiArrayType.shape) for feature in description.input
    }
    assert inputs == {"input_ids": [1, 1], "position": [1], "causal_mask": [1, 1, 1, CONTEXT]}
    assert [feature.name for feature in description.output] == ["logits"]
    states = {
        feature.name: list(feature.type.stateType.arrayType.shape) for feature in description.state
    }
    cache_shape = [1, ONE_LAYER.num_key_value_heads, CONTEXT, ONE_LAYER.head_dim]
    assert states == {"key_cache_0": cache_shape, "value_cache_0": cache_shape}

    temporary = Path(converted.package_path)
    assert temporary.is_dir()
    converter.save(converted, tmp_path / "model.mlpackage")
    assert (tmp_path / "model.mlpackage" / "Manifest.json").is_file()
    assert not temporary.exists()


@pytest.mark.parametrize(("attention", "kv"), [("folded", "state"), ("repeat_kv", "input")])
def test_weights_are_converted_without_copies(attention: str, kv: str) -> None:
    """Every weight matrix of the converted program is the torch parameter's own memory: no
    fp32 promotion (coremltools reads states and fp16 inputs as fp32, which used to promote
    o_proj), no copy per pass. And conversion leaves coremltools and torch as it found them."""
    import numpy as np
    import torch
    from coremltools.converters.mil.mil.passes.pass_pipeline import PassPipelineManager

    apply_pipeline, equal = PassPipelineManager.__dict__["apply_pipeline"], torch.equal
    model = build_model(ONE_LAYER, CONTEXT, attention, torch.float16, kv)
    variant = VariantSpec(attention=attention, kv=kv, context=CONTEXT, layers=1)
    program = CoreMLToolsConverter().to_program(model, Conversion(ONE_LAYER, variant))
    parameters = {name: p.detach().numpy() for name, p in model.named_parameters() if p.dim() == 2}
    matrices = {
        op.name: op.outputs[0].val
        for op in program.functions["main"].operations
        if op.op_type == "const" and getattr(op.outputs[0].val, "ndim", 0) == 2
    }
    for name, parameter in parameters.items():
        assert name in matrices, name
        assert np.shares_memory(matrices[name], parameter), name
    assert PassPipelineManager.__dict__["apply_pipeline"] is apply_pipeline
    assert torch.equal is equal


def test_build_package_releases_the_models(tmp_path: Path) -> None:
    import torch

    functions = {"main": build_model(ONE_LAYER, CONTEXT, dtype=torch.float16)}
    variant = VariantSpec(context=CONTEXT, layers=1)
    CoreMLToolsConverter().build_package(
        functions, Conversion(ONE_LAYER, variant), tmp_path / "m.mlpackage"
    )
    assert functions == {}


@pytest.mark.parametrize(
    ("variant", "message"),
    [
        (VariantSpec(attention=Attention.folded, context=128), "128"),
        (VariantSpec(attention=Attention.repeat_kv, context=CONTEXT), "repeat_kv"),
        (VariantSpec(attention=Attention.folded, context=CONTEXT, layers=3), "3"),
    ],
)
def test_model_and_variant_must_agree(variant: VariantSpec, message: str) -> None:
    model = build_model(ONE_LAYER, CONTEXT, Attention.folded)
    with pytest.raises(ConversionError, match=message):
        convert(model, ONE_LAYER, variant)


def _program_ops(path: Path) -> list[tuple[str, tuple[str, ...]]]:
    """Every op of every function: (type, output names), in order, constexpr data compared apart."""
    from coremltools.proto import Model_pb2

    spec = Model_pb2.Model.FromString(
        next(path.glob("Data/com.apple.CoreML/model.mlmodel")).read_bytes()
    )
    ops = []
    for _, function in sorted(spec.mlProgram.functions.items()):
        for block in function.block_specializations.values():
            ops += [(op.type, tuple(o.name for o in op.outputs)) for op in block.operations]
    return ops


@pytest.mark.parametrize(
    ("attention", "kv", "quant"),
    [
        (Attention.folded, "state", "fp16"),
        (Attention.repeat_kv, "state", "w8"),
        (Attention.folded, "state", "base"),
    ],
)
def test_fast_pipeline_builds_what_plain_coremltools_builds(
    tmp_path: Path, attention: Attention, kv: str, quant: str
) -> None:
    """Against trace + ct.convert + ct.optimize.coreml with the default pipelines and the same
    recipe (decodebench.formats.coreml.quant.plain): fp16 is the same program op for op; quantized, every
    compressed weight is byte-equal and the programs decode identically, and the only ops the
    plain program has beyond ours are the extra negative-index guards each ct.optimize call adds
    in front of the token gather (coremltools' guard_negative_gather_indices is not idempotent)."""
    from collections import Counter

    import coremltools as ct
    import torch

    from decodebench.contracts.recipes import parse_recipe
    from decodebench.formats.coreml import compat
    from decodebench.formats.coreml.interface import input_types, output_types, state_types
    from decodebench.formats.coreml.quant.apply import QuantPlan
    from decodebench.formats.coreml.quant.plain import (
        compare_weights,
        optimize_calls,
        optimize_plain,
    )
    from decodebench.formats.coreml.verify import verify_packages
    from decodebench.modeling import example_inputs

    variant = VariantSpec(attention=attention, kv=kv, context=CONTEXT, layers=1, quant=quant)
    model = build_model(ONE_LAYER, CONTEXT, attention, torch.float16, kv)
    parameters = [name for name, _ in model.named_parameters()]
    recipe = parse_recipe(quant)
    ours = tmp_path / "ours.mlpackage"
    CoreMLToolsConverter().build_package(
        {"main": model}, Conversion(ONE_LAYER, variant), ours, QuantPlan(recipe, True)
    )

    compat.install()
    traced = compat.trace(model, example_inputs(model))
    model.reset_cache()
    plain = ct.convert(
        traced, inputs=input_types(model), outputs=output_types(model),
        states=state_types(model), convert_to="mlprogram",
        minimum_deployment_target=ct.target.iOS18, compute_precision=ct.precision.FLOAT16,
        skip_model_load=True,
    )  # fmt: skip
    plain = optimize_plain(plain, parameters, QuantPlan(recipe, True))
    plain.save(str(tmp_path / "plain.mlpackage"))
    ours_ops, plain_ops = _program_ops(ours), _program_ops(tmp_path / "plain.mlpackage")
    if quant == "fp16":
        assert ours_ops == plain_ops
        return
    calls = optimize_calls(QuantPlan(recipe, True), parameters)
    assert calls == (2 if quant == "base" else 1)
    ours_kinds, plain_kinds = Counter(k for k, _ in ours_ops), Counter(k for k, _ in plain_ops)
    assert ours_kinds - plain_kinds == Counter()
    extra = plain_kinds - ours_kinds
    assert {kind: extra[kind] for kind in ("greater_equal", "add", "select")} == dict.fromkeys(
        ("greater_equal", "add", "select"), calls
    )
    assert set(extra) <= {"greater_equal", "add", "select", "const", "cast"}

    weights = compare_weights(ours, tmp_path / "plain.mlpackage")
    assert weights.identical, weights
    expected = {"w8": 8, "base": 8}[quant]  # embedding + 7 projections of the one layer
    assert len(weights.equal) == expected
    result = verify_packages(ours, tmp_path / "plain.mlpackage", steps=4)
    assert result.agree and result.max_abs_diff == 0.0, result
