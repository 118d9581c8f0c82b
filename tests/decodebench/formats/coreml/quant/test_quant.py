"""Quantization: the recipe grammar, coremltools-identical numerics, measured sensitivity."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from decodebench.contracts.domain import VariantSpec
from decodebench.contracts.presets import TINY_EXAONE, TINY_GQA, TINY_LLAMA, ModelConfig, get_preset
from decodebench.contracts.recipes import INT4, INT8, LUT6, RecipeError, parse_recipe
from decodebench.formats.coreml.quant.apply import QuantPlan, decompress, weight_role
from decodebench.formats.coreml.quant.numeric import (
    dequantize,
    fake_quantize_linear,
    palettize,
    quantize_linear,
    to_dtype,
)
from decodebench.formats.coreml.quant.sensitivity import (
    calibration_tokens,
    measure,
    measure_each,
    promoted_layers,
    rank,
)
from decodebench.modeling import build_model


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


def test_dequantization_is_the_devices_fp16_arithmetic() -> None:
    weight = (torch.randn(96, 256, generator=torch.Generator().manual_seed(3)) * 0.02).half()
    weight[0, :32] = 0  # a block of zeros: scale 0
    quantized = quantize_linear(weight, 4, 32)
    data, scale = torch.from_numpy(quantized.data), torch.from_numpy(quantized.scale)
    device = (data.view(96, 8, 32).half() * scale[..., None]).view(96, 256)  # fp16 multiply
    assert torch.equal(dequantize(quantized), device)
    assert torch.equal(dequantize(quantized, torch.bfloat16), device.float().bfloat16())
    # Sensitivity's one-pass version computes the same weights without the integers.
    assert torch.equal(fake_quantize_linear(weight, 4, 32, torch.bfloat16), device.bfloat16())
    assert torch.equal(to_dtype(weight, torch.bfloat16), weight.float().bfloat16())
    assert not dequantize(quantized)[0, :32].any()


def test_promotion_forgets_compressions_the_artifact_will_not_use() -> None:
    plan = QuantPlan(parse_recipe("top1"), tied=True)
    weight = (torch.randn(64, 64, generator=torch.Generator().manual_seed(4)) * 0.02).half()
    for layer in (0, 1):
        plan.compress(f"model.layers.{layer}.mlp.up_proj.weight", weight)
    plan.promote(frozenset({0}))
    assert set(plan._cache) == {"model.layers.1.mlp.up_proj.weight|int4/32"}
    assert plan.scheme_for("model.layers.0.mlp.up_proj.weight") == INT8


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


def naive_kl(model: torch.nn.Module, plan: QuantPlan, tokens: torch.Tensor) -> list[float]:
    """The definition, with nothing shared: per layer, an fp32 copy of the decoder itself (a
    prefill call over each calibration prompt) with only that layer's weights quantized."""

    def log_probabilities(weights: dict[str, torch.Tensor]) -> torch.Tensor:
        fp32 = build_model(model.config, 64, dtype=torch.float32, weights=weights)
        prefill = fp32.sibling(tokens.shape[1])
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

    fp16 = {name: parameter.detach() for name, parameter in model.named_parameters()}
    reference = log_probabilities({name: value.float() for name, value in fp16.items()})
    result = []
    for layer in range(model.config.num_layers):
        weights = {}
        for name, value in fp16.items():
            compressed = (
                plan.compress(name, value) if name.startswith(f"model.layers.{layer}.") else None
            )
            weights[name] = (value if compressed is None else decompress(compressed)).float()
        candidate = log_probabilities(weights)
        result.append(float((reference.exp() * (reference - candidate)).sum(-1).mean()))
    return result


def test_the_measurement_through_the_family_layer_is_the_definition(tiny) -> None:
    """measure_each (every family the one-pass runner does not reproduce) against the naive
    definition, on a family both can run."""
    plan = QuantPlan(parse_recipe("top1"), tied=True)
    tokens = calibration_tokens(tiny.config.vocab_size, prompts=2, length=12)
    expected = naive_kl(tiny, plan, tokens)
    measured = measure_each(tiny, plan, tokens)
    for layer, kl in enumerate(expected):
        assert kl > 0
        assert measured[layer].kl == pytest.approx(kl, rel=2e-3, abs=1e-7)


def test_sensitivity_equals_quantizing_one_layer_at_a_time(tiny) -> None:
    """The one-pass measurement against the definition: in fp32 to rounding, and with the
    default bf16 layer matmuls to a few percent, ranking unchanged."""
    plan = QuantPlan(parse_recipe("top1"), tied=True)
    tokens = calibration_tokens(tiny.config.vocab_size, prompts=2, length=12)
    expected = naive_kl(tiny, plan, tokens)
    exact = measure(tiny, plan, tokens, matmul_dtype=torch.float32)
    default = measure(tiny, plan, tokens)
    for layer, kl in enumerate(expected):
        assert kl > 0
        assert exact[layer].kl == pytest.approx(kl, rel=2e-3, abs=1e-7)
        assert default[layer].kl == pytest.approx(kl, rel=5e-2)
    assert [item.layer for item in rank(default)] == [item.layer for item in rank(exact)]
    ranking = rank(exact)
    assert [item.kl for item in ranking] == sorted((item.kl for item in exact), reverse=True)
    assert promoted_layers(parse_recipe("top2"), ranking) == {ranking[0].layer, ranking[1].layer}


def small(preset: str, seed: int = 0) -> ModelConfig:
    """A published family preset at test size: its family's layer, a few narrow layers (the
    seed: one whose layers' KLs stand at least 10% apart, as the planted test asks)."""
    config = get_preset(preset)
    heads, kv_heads = (4, 2) if config.num_key_value_heads > 1 else (4, 1)
    return config.model_copy(
        update={
            "hidden_size": 128,
            "intermediate_size": 256,
            "vocab_size": 512,
            "num_attention_heads": heads,
            "num_key_value_heads": kv_heads,
            "head_dim": 32,
            "sliding_window": 4 if config.sliding_window else None,
            "seed": seed,
        }
    )


SMALL_FAMILIES = [small("gemma-3-270m"), small("phi-4-mini", seed=1), small("smollm3-3b", seed=1)]


@pytest.mark.parametrize(
    ("preset", "planted"),
    [(TINY_EXAONE, 2), (TINY_LLAMA, 4), *((config, 3) for config in SMALL_FAMILIES)],
    ids=["exaone4", "llama", *(config.family for config in SMALL_FAMILIES)],
)
def test_ranking_follows_a_planted_hard_to_quantize_layer(preset, planted: int) -> None:
    """Random weights rank layers by depth (the earliest perturbation travels furthest): a
    ranking that ignored the measurement could reproduce that. Here one layer gets an outlier
    input column in every block of 32 (x16), the pattern that makes real layers hard to quantize
    (the block's scale follows the outlier, the other 31 weights lose their bits). The ranking
    must then leave depth order, and be the naive one-layer-at-a-time ranking."""
    config = preset.model_copy(update={"num_layers": 6})
    if preset.sliding_layers is not None:
        config = config.model_copy(update={"sliding_layers": (1, 1, 0, 1, 1, 0)})
    if preset.no_rope_layers is not None:
        config = config.model_copy(update={"no_rope_layers": (1, 1, 1, 0, 1, 1)})
    model = build_model(config, 64, dtype=torch.float16)
    with torch.no_grad():
        for name, parameter in model.model.layers[planted].named_parameters():
            if name.endswith("_proj.weight"):
                parameter[:, ::32] *= 16
    plan = QuantPlan(parse_recipe("top1"), tied=model.config.tie_word_embeddings)
    tokens = calibration_tokens(model.config.vocab_size, prompts=2, length=12)
    expected = naive_kl(model, plan, tokens)
    naive_order = sorted(range(len(expected)), key=lambda index: -expected[index])
    ordered = sorted(expected, reverse=True)
    # Neighbours at least 10% apart: the order is the measurement's, not rounding's.
    assert min(high / low for high, low in itertools.pairwise(ordered)) > 1.1
    assert naive_order.index(planted) < planted  # ahead of a shallower layer
    measured = measure(model, plan, tokens)
    assert [item.layer for item in rank(measured)] == naive_order
    for item in measured:
        assert item.kl == pytest.approx(expected[item.layer], rel=5e-2)
