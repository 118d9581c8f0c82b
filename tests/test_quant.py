"""Quantization: the recipe grammar, coremltools-identical numerics, measured sensitivity."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from decodebench.domain import VariantSpec
from decodebench.modeling import build_model
from decodebench.presets import TINY_GQA
from decodebench.quant.apply import QuantPlan, decompress, weight_role
from decodebench.quant.numeric import palettize, quantize_linear
from decodebench.quant.recipe import INT4, INT8, LUT6, RecipeError, parse_recipe
from decodebench.quant.sensitivity import calibration_tokens, measure, promoted_layers, rank


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("fp16", "fp16"),
        ("W8", "w8"),
        ("attn=int4, ffn=int4/32, embed=int4, lm_head=lut6", "base"),
        ("top08", "top8"),
        ("attn=int4,ffn=int4,embed=int4,lm_head=lut6,top3=int8", "top3"),
        ("top0", "base"),
        ("ffn=int4/64,top2", "ffn=int4/64,top2=int8"),
        ("lm_head=lut4", "lm_head=lut4"),
    ],
)
def test_recipes_have_one_spelling(text: str, canonical: str) -> None:
    assert parse_recipe(text).canonical == canonical
    assert parse_recipe(canonical) == parse_recipe(text)


def test_presets_mean_what_the_issue_says() -> None:
    base = parse_recipe("base")
    assert (base.attn, base.ffn, base.embed, base.lm_head) == (INT4, INT4, INT4, LUT6)
    top8 = parse_recipe("top8")
    assert top8.promote_top == 8 and top8.promote_to == INT8 and top8.ffn == INT4
    assert parse_recipe("w8").ffn == INT8 and parse_recipe("w4").lm_head == INT4


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty recipe"),
        ("ffn=int3", "unknown scheme 'int3'"),
        ("mlp=int4", "unknown target 'mlp'"),
        ("ffn", "needs a scheme"),
        ("lut5", "unknown target"),
        ("lm_head=lut5", "lut5"),
        ("ffn=int4/0", "must be 1..4096"),
        ("ffn=int4,ffn=int8", "given twice"),
    ],
)
def test_bad_recipes_say_why(text: str, message: str) -> None:
    with pytest.raises(RecipeError, match=message):
        parse_recipe(text)


def test_variant_names_the_quant_field() -> None:
    with pytest.raises(ValueError, match=r"quant\n.*unknown scheme 'int3'"):
        VariantSpec(quant="ffn=int3")
    assert VariantSpec(quant="TOP8").quant == "top8"


@pytest.mark.parametrize(("bits", "block"), [(4, 32), (4, 64), (8, 0), (8, 32)])
def test_linear_quantization_is_coremltools_bit_for_bit(bits: int, block: int) -> None:
    from coremltools.converters.mil.mil import types
    from coremltools.optimize import _utils as optimize_utils

    weight = (
        torch.randn(96, 256, generator=torch.Generator().manual_seed(bits + block)) * 0.02
    ).half()
    ours = quantize_linear(weight, bits, block)
    dtype = types.int4 if bits == 4 else types.int8
    data, scale, offset = optimize_utils.compute_qparams_by_dtype(
        weight.numpy(), dtype, "LINEAR_SYMMETRIC", [1, block]
    )
    assert offset is None
    assert np.array_equal(ours.data, data)
    assert np.array_equal(ours.scale.reshape(scale.shape), scale)
    assert np.abs(ours.data).max() <= 2 ** (bits - 1) - 1


def test_palettization_is_a_good_kmeans() -> None:
    weight = (torch.randn(512, 512, generator=torch.Generator().manual_seed(1)) * 0.02).half()
    palette = palettize(weight, 6)
    assert palette.lut.shape == (64,) and palette.indices.max() < 64
    error = (decompress(palette).float() - weight.float()).pow(2).mean().sqrt()
    # 64 levels fitted to a Gaussian beat the uniform grid (range / 64 / sqrt(12)).
    uniform = float(weight.float().max() - weight.float().min()) / 64 / 12**0.5
    assert float(error) < uniform
    # Every weight maps to its nearest table entry.
    nearest = np.abs(weight.float().numpy()[..., None] - palette.lut.astype(np.float32)).argmin(-1)
    chosen = np.abs(weight.float().numpy() - palette.lut.astype(np.float32)[palette.indices])
    best = np.abs(weight.float().numpy() - palette.lut.astype(np.float32)[nearest])
    assert np.array_equal(chosen, best)


def test_tied_embedding_follows_lm_head() -> None:
    plan = QuantPlan(parse_recipe("base"), tied=True)
    assert weight_role("model.embed_tokens.weight", tied=True).target == "lm_head"
    assert plan.scheme_for("model.embed_tokens.weight") == LUT6
    assert (
        QuantPlan(parse_recipe("base"), tied=False).scheme_for("model.embed_tokens.weight") == INT4
    )
    promoted = QuantPlan(parse_recipe("top1"), tied=True, promoted=frozenset({1}))
    assert promoted.scheme_for("model.layers.1.mlp.up_proj.weight") == INT8
    assert promoted.scheme_for("model.layers.0.mlp.up_proj.weight") == INT4
    assert promoted.scheme_for("model.norm.weight") is None


@pytest.fixture(scope="module")
def tiny() -> torch.nn.Module:
    return build_model(TINY_GQA.model_copy(update={"num_layers": 3}), 64, dtype=torch.float16)


def test_sensitivity_equals_quantizing_one_layer_at_a_time(tiny) -> None:
    """The one-pass measurement against the definition: per layer, the decoder itself (a
    prefill call over the calibration prompt) with only that layer's weights quantized."""
    plan = QuantPlan(parse_recipe("top1"), tied=True)
    tokens = calibration_tokens(tiny.config.vocab_size, prompts=2, length=12)
    measured = measure(tiny, plan, tokens)

    def log_probabilities(model: torch.nn.Module) -> torch.Tensor:
        prefill = model.sibling(tokens.shape[1])
        rows = []
        for prompt in tokens.tolist():
            prefill.reset_cache()
            with torch.no_grad():
                rows.append(
                    prefill(
                        torch.tensor([prompt], dtype=torch.int32),
                        torch.tensor([0], dtype=torch.int32),
                    )[0]
                )
        return torch.log_softmax(torch.cat(rows).float(), -1)

    fp32 = build_model(tiny.config, 64, dtype=torch.float32)
    reference = log_probabilities(fp32)
    for layer in range(tiny.config.num_layers):
        candidate = build_model(tiny.config, 64, dtype=torch.float32)
        with torch.no_grad():
            for name, parameter in candidate.model.layers[layer].named_parameters():
                full = f"model.layers.{layer}.{name}"
                compressed = plan.compress(full, parameter.half())
                if compressed is not None:
                    parameter.copy_(decompress(compressed).float())
        kl = (reference.exp() * (reference - log_probabilities(candidate))).sum(-1).mean()
        assert measured[layer].kl == pytest.approx(float(kl), rel=2e-3, abs=1e-7)
        assert measured[layer].kl > 0
    ranking = rank(measured)
    assert [item.kl for item in ranking] == sorted((item.kl for item in measured), reverse=True)
    assert promoted_layers(parse_recipe("top2"), ranking) == {ranking[0].layer, ranking[1].layer}
