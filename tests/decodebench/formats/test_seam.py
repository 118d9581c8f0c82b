"""The format seam: a format is found by name, speaks in no SDK's types, and Core ML through it
converts a decoder, reads its graph for the analyses and decodes the fp32 reference's tokens."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch

from decodebench.formats import FORMATS, UnknownFormat, get_format
from decodebench.formats.seam import ModelFormat

SDK_WORDS = ("coremltools", "ct.", "MLModel", "_pb2", "mil.")


def test_an_unknown_format_is_refused_by_name_with_the_known_ones() -> None:
    with pytest.raises(
        UnknownFormat, match=r"no model format 'onnx': the formats are coreai, coreml"
    ):
        get_format("onnx")


def _protocol_members() -> dict[str, object]:
    return {
        name: member
        for name, member in vars(ModelFormat).items()
        if not name.startswith("_") and callable(member)
    }


def test_the_protocol_names_no_sdk_type() -> None:
    for name, member in _protocol_members().items():
        signature = str(inspect.signature(member))  # type: ignore[arg-type]
        assert not any(word in signature for word in SDK_WORDS), f"{name}{signature}"


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_every_format_implements_the_whole_protocol(name: str) -> None:
    found = get_format(name)
    assert found.name == name and found.artifact_name and found.toolchain_packages
    for member_name, member in _protocol_members().items():
        implemented = getattr(found, member_name)
        wanted = list(inspect.signature(member).parameters)[1:]  # type: ignore[arg-type]
        assert list(inspect.signature(implemented).parameters) == wanted, member_name


@pytest.mark.slow
def test_coreml_through_the_seam_decodes_the_fp32_tokens(tmp_path) -> None:
    from decodebench.analysis.analyze import analyze_mlpackage, analyze_program
    from decodebench.contracts.domain import Attention, VariantSpec
    from decodebench.contracts.presets import TINY_GQA
    from decodebench.modeling import build_model, greedy_decode

    context, prompt, steps = 64, [7, 3, 9], 6
    variant = VariantSpec(attention=Attention.repeat_kv, context=context)
    torch.manual_seed(0)
    reference = build_model(TINY_GQA, context, Attention.repeat_kv, torch.float32)
    fp16 = build_model(TINY_GQA, context, Attention.repeat_kv, torch.float16)
    fp16.load_state_dict({key: value.half() for key, value in reference.state_dict().items()})
    coreml = get_format("coreml")
    path = tmp_path / coreml.artifact_name
    coreml.build_package({"main": fp16}, TINY_GQA, variant, path)

    program = coreml.read_graph(path)
    assert program.decode_function == "main" and "tile" in program.known_ops
    analysis = analyze_program(program)
    assert analysis == analyze_mlpackage(path)
    assert analysis.tile_ops == 2 * TINY_GQA.num_layers  # K and V replicated per layer

    expected, _ = greedy_decode(reference, prompt, steps)
    engine = coreml.open_engine(path)
    token, generated = prompt[0], []
    for position in range(len(prompt) + steps - 1):
        logits = engine.step(token, position)
        assert np.isfinite(logits).all()
        token = prompt[position + 1] if position + 1 < len(prompt) else int(np.argmax(logits))
        if position + 1 >= len(prompt):
            generated.append(token)
    assert generated == expected
