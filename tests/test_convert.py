"""The coremltools backend: the converted interface, its stages, and what it leaves behind."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from decodebench.convert import ConversionError, CoreMLToolsConverter, convert
from decodebench.domain import Attention, VariantSpec
from decodebench.modeling import build_model
from decodebench.presets import TINY_GQA

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
