"""Weight bytes of quantized tiny-gqa builds, recipe by recipe, against hand-computed sizes.

The recipes are applied with ``coremltools.optimize.coreml`` to a one-layer fp16 build, the way
the quantization recipes of the build pipeline lay weights out: int8 per output channel and
int4 per block of 32 inputs (``constexpr_blockwise_shift_scale``), 6-bit palettized lm_head
(``constexpr_lut_to_dense``), and the mix of all three. Each must match the sizes computed here
from the model's shape, and the saved weight file within 2%.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import coremltools as ct
import coremltools.optimize.coreml as cto
import pytest

from decodebench.analysis.analyze import analyze_mlpackage
from decodebench.building.build import build_variant
from decodebench.contracts.analysis import GraphAnalysis
from decodebench.contracts.domain import Attention, VariantSpec
from decodebench.contracts.presets import TINY_GQA

pytestmark = pytest.mark.slow
logging.getLogger("coremltools").setLevel(logging.ERROR)

CONTEXT = 64
FP16 = 2
HIDDEN, FFN = TINY_GQA.hidden_size, TINY_GQA.intermediate_size
Q_WIDTH = TINY_GQA.num_attention_heads * TINY_GQA.head_dim
KV_WIDTH = TINY_GQA.num_key_value_heads * TINY_GQA.head_dim
LAYER = "model_layers_0"
# [out, in] of every matrix of a one-layer build; the embedding is also the (tied) lm_head.
MATRICES = {
    "model_embed_tokens_weight": (TINY_GQA.vocab_size, HIDDEN),
    f"{LAYER}_self_attn_q_proj_weight": (Q_WIDTH, HIDDEN),
    f"{LAYER}_self_attn_k_proj_weight": (KV_WIDTH, HIDDEN),
    f"{LAYER}_self_attn_v_proj_weight": (KV_WIDTH, HIDDEN),
    f"{LAYER}_self_attn_o_proj_weight": (HIDDEN, Q_WIDTH),
    f"{LAYER}_mlp_gate_proj_weight": (FFN, HIDDEN),
    f"{LAYER}_mlp_up_proj_weight": (FFN, HIDDEN),
    f"{LAYER}_mlp_down_proj_weight": (HIDDEN, FFN),
}
ATTENTION = [name for name in MATRICES if "self_attn" in name]
FFN_MATRICES = [name for name in MATRICES if "_mlp_" in name]
LM_HEAD = "model_embed_tokens_weight"
# Not quantized: norms (2 per layer of HIDDEN, q/k norms of head_dim, the final norm), the RoPE
# tables and the zero biases coremltools gives each linear (one per distinct output width).
NORMS = 3 * HIDDEN + 2 * TINY_GQA.head_dim
ROPE = 2 * CONTEXT * TINY_GQA.head_dim
BIASES = Q_WIDTH + KV_WIDTH + HIDDEN
BLOCK = 32
LARGE = 100_000  # elements: quantize the matrices only


def int8_per_channel(out: int, inputs: int) -> int:
    return out * inputs + out * FP16


def int4_per_block(out: int, inputs: int) -> int:
    return out * inputs // 2 + out * (inputs // BLOCK) * FP16


def palettized_6bit(out: int, inputs: int) -> int:
    return out * inputs * 6 // 8 + 2**6 * FP16


def fp16_bytes(names: list[str]) -> int:
    return sum(out * inputs * FP16 for out, inputs in (MATRICES[name] for name in names))


DENSE = (NORMS + ROPE + BIASES) * FP16
INT8 = cto.OpLinearQuantizerConfig(
    mode="linear_symmetric", dtype="int8", granularity="per_channel", weight_threshold=LARGE
)
INT4 = cto.OpLinearQuantizerConfig(
    mode="linear_symmetric",
    dtype="int4",
    granularity="per_block",
    block_size=BLOCK,
    weight_threshold=LARGE,
)
PALETTE6 = cto.OpPalettizerConfig(nbits=6, mode="uniform", granularity="per_tensor")


@pytest.fixture(scope="module")
def fp16_package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fp16")
    variant = VariantSpec(attention=Attention.folded, context=CONTEXT, layers=1)
    build_variant(TINY_GQA.name, variant, out)
    return out / "model.mlpackage"


def _apply(
    source: Path, target: Path, steps: list[Callable[[ct.models.MLModel], ct.models.MLModel]]
) -> GraphAnalysis:
    model = ct.models.MLModel(str(source), skip_model_load=True)
    for step in steps:
        model = step(model)
    model.save(str(target))
    return analyze_mlpackage(target)


def _quantize(config: cto.OptimizationConfig):
    return lambda model: cto.linear_quantize_weights(model, config)


def _palettize(config: cto.OptimizationConfig):
    return lambda model: cto.palettize_weights(model, config)


def _check(analysis: GraphAnalysis, expected: int) -> None:
    assert analysis.weight_bytes == expected
    assert abs(analysis.weight_file_bytes - expected) <= 0.02 * expected


def test_fp16_build(fp16_package: Path) -> None:
    _check(analyze_mlpackage(fp16_package), fp16_bytes(list(MATRICES)) + DENSE)


def test_int8_per_channel(fp16_package: Path, tmp_path: Path) -> None:
    config = cto.OptimizationConfig(global_config=INT8)
    analysis = _apply(fp16_package, tmp_path / "int8.mlpackage", [_quantize(config)])
    expected = sum(int8_per_channel(*shape) for shape in MATRICES.values())
    assert analysis.weight_bytes_by_encoding == {
        "constexpr_blockwise_shift_scale": expected,
        "dense": DENSE,
    }
    _check(analysis, expected + DENSE)


def test_int4_per_block(fp16_package: Path, tmp_path: Path) -> None:
    config = cto.OptimizationConfig(global_config=INT4)
    analysis = _apply(fp16_package, tmp_path / "int4.mlpackage", [_quantize(config)])
    expected = sum(int4_per_block(*shape) for shape in MATRICES.values())
    assert analysis.weight_bytes_by_dtype["int4"] == sum(o * i // 2 for o, i in MATRICES.values())
    _check(analysis, expected + DENSE)


def test_palettized_lm_head(fp16_package: Path, tmp_path: Path) -> None:
    config = cto.OptimizationConfig(op_name_configs={LM_HEAD: PALETTE6})
    analysis = _apply(fp16_package, tmp_path / "pal6.mlpackage", [_palettize(config)])
    expected = palettized_6bit(*MATRICES[LM_HEAD])
    assert analysis.weight_bytes_by_encoding["constexpr_lut_to_dense"] == expected
    rest = [name for name in MATRICES if name != LM_HEAD]
    _check(analysis, expected + fp16_bytes(rest) + DENSE)


def test_mixed_recipe(fp16_package: Path, tmp_path: Path) -> None:
    """FFN int4 per block, attention int8 per channel, lm_head 6-bit palettized."""
    quantize = cto.OptimizationConfig(
        op_name_configs={
            **{name: INT4 for name in FFN_MATRICES},
            **{name: INT8 for name in ATTENTION},
        }
    )
    palettize = cto.OptimizationConfig(op_name_configs={LM_HEAD: PALETTE6})
    analysis = _apply(
        fp16_package,
        tmp_path / "mixed.mlpackage",
        [_quantize(quantize), _palettize(palettize)],
    )
    expected = (
        sum(int4_per_block(*MATRICES[name]) for name in FFN_MATRICES)
        + sum(int8_per_channel(*MATRICES[name]) for name in ATTENTION)
        + palettized_6bit(*MATRICES[LM_HEAD])
    )
    assert set(analysis.weight_bytes_by_encoding) == {
        "constexpr_blockwise_shift_scale",
        "constexpr_lut_to_dense",
        "dense",
    }
    _check(analysis, expected + DENSE)
    # Read per token: everything but the RoPE tables, of which one row each is gathered.
    rope_read = 2 * TINY_GQA.head_dim * FP16
    assert analysis.bytes_per_token.weights == expected + DENSE - ROPE * FP16 + rope_read


RECIPES = {
    "w8": lambda: sum(int8_per_channel(*shape) for shape in MATRICES.values()),
    "w4": lambda: sum(int4_per_block(*shape) for shape in MATRICES.values()),
    # base: attention, FFN and embedding int4/32; the tied embedding follows lm_head: lut6.
    "base": lambda: (
        sum(int4_per_block(*MATRICES[name]) for name in ATTENTION + FFN_MATRICES)
        + palettized_6bit(*MATRICES[LM_HEAD])
    ),
    # top1 on a one-layer model: base with that layer's attention and FFN promoted to int8.
    "top1": lambda: (
        sum(int8_per_channel(*MATRICES[name]) for name in ATTENTION + FFN_MATRICES)
        + palettized_6bit(*MATRICES[LM_HEAD])
    ),
}


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_the_build_pipelines_recipes(recipe: str, tmp_path: Path) -> None:
    """The same accounting for the recipes `decodebench build --quant` applies itself."""
    variant = VariantSpec(attention=Attention.folded, context=CONTEXT, layers=1, quant=recipe)
    analysis = build_variant(TINY_GQA.name, variant, tmp_path).analysis
    _check(analysis, RECIPES[recipe]() + DENSE)
