"""Quantized Core AI builds of the tiny GQA preset through coreai-opt: every op of a decode step
(the dequantization included) held to Apple's runtime, the greedy tokens they decode, the
weights counted at their stored width, and the recipes coreai-opt cannot apply refused by name.

w8 is held to the fp16 build's tokens: int8 per channel moves each weight by under half a step
of 1/127 of its row's largest, below what separates this model's greedy choices. w4 (int4 per
block of 32) moves them by up to 1/14 and changes the tokens of a random-weight model, so it is
held to the torch fp32 reference given the very weights the program expands (each read back
from the engine's dequantized constants): the same numbers, computed two ways.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from decodebench.contracts.domain import VariantSpec
from decodebench.contracts.presets import get_preset
from decodebench.modeling import DecodeStepModel
from decodebench.modeling.host import HostCache, run_call

from .conftest import CONTEXT

pytestmark = pytest.mark.slow
PROMPT = [1, 5, 9, 13]
STEPS = 6
# Weight matrices of tiny-gqa: 7 per layer (q, k, v, o, gate, up, down) and the tied embedding.
WEIGHT_MATRICES = 2 * 7 + 1
LUT4 = "embed=lut4,attn=lut4,ffn=lut4,lm_head=lut4"


@pytest.fixture(scope="module")
def quantized(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from decodebench.formats.coreai.convert import convert_preset

    root = tmp_path_factory.mktemp("coreai-quant")
    built = {}
    for quant in ("w8", "w4", LUT4):
        variant = VariantSpec(format="coreai", attention="folded", context=CONTEXT, quant=quant)
        built[quant] = convert_preset(
            get_preset("tiny-gqa"), variant, root / f"{len(built)}.aimodel"
        )
    return built


def _greedy(step) -> list[int]:  # type: ignore[no-untyped-def]
    for position, token in enumerate(PROMPT[:-1]):
        step(token, position)
    token, position, tokens = PROMPT[-1], len(PROMPT) - 1, []
    for _ in range(STEPS):
        token = step(token, position)
        tokens.append(token)
        position += 1
    return tokens


def _engine_tokens(path: Path) -> list[int]:
    from decodebench.formats.coreai.session import open_session

    session = open_session(path)
    return _greedy(session.next_token)


@pytest.mark.parametrize(
    ("quant", "kind"),
    [("w8", "blockwise_shift_scale"), ("w4", "blockwise_shift_scale"), (LUT4, "lut_to_dense")],
)
def test_every_op_of_a_quantized_step_agrees_with_apples_runtime(
    quantized: dict[str, Path], quant: str, kind: str
) -> None:
    from decodebench.formats.coreai.arbiter import hold_to_runtime
    from decodebench.formats.coreai.session import open_session

    session = open_session(quantized[quant])
    session.prefill(PROMPT[:2])
    report = hold_to_runtime(session.program, session.engine.function, session.feeds_at(9, 2))
    assert report.by_kind[kind] == WEIGHT_MATRICES
    assert report.worst[kind] == 0.0  # every expanded weight bit-exact
    assert report.ops == len(session.engine.steps) + len(session.engine.folded)


def test_w8_decodes_the_fp16_builds_tokens(
    quantized: dict[str, Path], coreai_assets: dict[str, Path]
) -> None:
    assert _engine_tokens(quantized["w8"]) == _engine_tokens(coreai_assets["folded"])


def _dequantized_reference(path: Path) -> DecodeStepModel:
    """The fp32 torch decoder given the weights the program expands: each matrix matched to
    the expanded weight of its shape nearest to it (quantization moves it by a few percent of
    its range, any other matrix is unrelated random numbers)."""
    from decodebench.formats.coreai.session import open_session

    engine = open_session(path).engine
    expanded = [
        engine.constants[step.results[0]]
        for step in engine.folded
        if step.operation.kind == "blockwise_shift_scale"
    ]
    model = DecodeStepModel(get_preset("tiny-gqa"), CONTEXT, "folded", torch.float32, "input")
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if parameter.ndim != 2:
                continue
            original = parameter.numpy()
            same = [weight for weight in expanded if weight.shape == original.shape]
            gaps = [float(np.max(np.abs(weight - original))) for weight in same]
            assert same, f"{name}: no expanded weight of shape {original.shape}"
            parameter.copy_(torch.from_numpy(same[int(np.argmin(gaps))].astype(np.float32)))
    return model


def test_w4_decodes_the_reference_dequantized_the_same_way(quantized: dict[str, Path]) -> None:
    model = _dequantized_reference(quantized["w4"])
    host = HostCache(model)

    def step(token: int, position: int) -> int:
        return int(run_call(model, [token], position, host)[-1].argmax())

    assert _engine_tokens(quantized["w4"]) == _greedy(step)


def _quantized_elements(path: Path, kind: str) -> int:
    from decodebench.formats.coreai.program import load_program

    function = load_program(path).functions["main"]
    data = [op.operands[0] for op in function.operations if op.kind == kind]
    return sum(int(np.prod(function.types[key].shape)) for key in data)


def test_the_analysis_counts_each_weight_at_its_stored_width(
    quantized: dict[str, Path], coreai_assets: dict[str, Path]
) -> None:
    from decodebench.analysis.analyze import analyze_mlpackage

    fp16 = analyze_mlpackage(coreai_assets["folded"], "coreai")
    w8 = analyze_mlpackage(quantized["w8"], "coreai")
    w4 = analyze_mlpackage(quantized["w4"], "coreai")
    lut4 = analyze_mlpackage(quantized[LUT4], "coreai")
    elements = _quantized_elements(quantized["w4"], "blockwise_shift_scale")
    assert elements == _quantized_elements(quantized["w8"], "blockwise_shift_scale")
    assert w8.weight_bytes_by_dtype["int8"] == elements
    assert w4.weight_bytes_by_dtype["int4"] == elements // 2
    assert lut4.weight_bytes_by_dtype["uint4"] == elements // 2
    small = fp16.weight_bytes - 2 * elements  # norms: left fp16
    # int4 per block of 32 with one fp16 scale per block: 4.5 bits a weight (the zero
    # offsets are splats, one value each); int8 per channel: 8 bits and a scale per row.
    assert w4.weight_bytes == pytest.approx(elements * 4.5 / 8 + small, rel=0.01)
    assert 0.27 < w4.weight_bytes / fp16.weight_bytes < 0.30
    assert 0.50 < w8.weight_bytes / fp16.weight_bytes < 0.52
    assert not w4.unknown_ops and not lut4.unknown_ops


@pytest.mark.parametrize(
    ("quant", "refusal"),
    [
        ("base", r"quant: 'base' gives its targets different schemes \(.*lm_head=lut6\)"),
        ("ffn=int4/32", r"quant: 'ffn=int4/32' gives its targets different schemes"),
        ("top2", r"quant: 'top2' promotes the 2 most sensitive layers"),
    ],
)
def test_a_recipe_coreai_opt_cannot_apply_is_refused_by_name(quant: str, refusal: str) -> None:
    from decodebench.formats.coreai.convert import ConversionError, check_variant

    variant = VariantSpec(format="coreai", attention="folded", context=CONTEXT, quant=quant)
    with pytest.raises(ConversionError, match=refusal):
        check_variant(get_preset("tiny-gqa"), variant)


def test_a_block_that_does_not_divide_a_weight_is_refused_not_left_fp16(tmp_path: Path) -> None:
    from decodebench.formats.coreai.convert import ConversionError, convert_preset

    quant = "embed=int4/48,attn=int4/48,ffn=int4/48,lm_head=int4/48"
    variant = VariantSpec(format="coreai", attention="folded", context=CONTEXT, quant=quant)
    with pytest.raises(ConversionError, match=r"coreai-opt left 15 weight\(s\) uncompressed"):
        convert_preset(get_preset("tiny-gqa"), variant, tmp_path / "w.aimodel")
    assert not (tmp_path / "w.aimodel").exists()
