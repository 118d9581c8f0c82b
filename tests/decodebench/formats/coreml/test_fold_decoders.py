"""The fold on whole decoders: the project's repeat_kv build, and a decoder that replicates KV
with ``x.repeat(1, G, 1, 1)`` (query head h reads KV head h % Hkv), checked by running both
programs in the reference interpreter and against the PyTorch model they came from."""

from __future__ import annotations

import types
from pathlib import Path

import numpy as np
import pytest
import torch

from decodebench.analysis.analyze import analyze_mlpackage
from decodebench.building.build import PACKAGE_NAME, build_variant
from decodebench.contracts.domain import Attention, VariantSpec
from decodebench.contracts.presets import TINY_GQA
from decodebench.formats.coreml.convert import convert
from decodebench.formats.coreml.fold_package import fold_mlpackage, render
from decodebench.formats.coreml.program import quiet_coremltools
from decodebench.formats.coreml.verify import open_session, verify_packages
from decodebench.modeling import GroupedQueryAttention, build_model, greedy_decode

pytestmark = pytest.mark.slow

CONTEXT = 64
STEPS = 6

# The programs compute in fp16 and the fold reorders its reductions: logits may differ by a
# rounding step or two of the largest logit (fp16 keeps 11 significant bits), never more.
FP16_TWO_ULPS = 2.0**-9


def repeat_interleaved(
    self: GroupedQueryAttention,
    query,
    key_cache,
    value_cache,
    causal_mask,  # noqa: ANN001
) -> torch.Tensor:
    keys = key_cache.repeat(1, self.group_size, 1, 1)
    values = value_cache.repeat(1, self.group_size, 1, 1)
    return self._attend(query, keys, values, causal_mask)


def interleaved_model(dtype: torch.dtype) -> torch.nn.Module:
    model = build_model(TINY_GQA, CONTEXT, Attention.repeat_kv, dtype)
    for layer in model.model.layers:
        layer.self_attn.repeat_kv = types.MethodType(repeat_interleaved, layer.self_attn)
    return model


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("decoders")
    paths: dict[str, Path] = {}
    with quiet_coremltools():
        for attention in Attention:
            variant = VariantSpec(attention=attention, context=CONTEXT)
            build_variant(TINY_GQA.name, variant, root / attention.value)
            paths[attention.value] = root / attention.value / PACKAGE_NAME
        variant = VariantSpec(attention=Attention.repeat_kv, context=CONTEXT)
        mlmodel = convert(interleaved_model(torch.float16), TINY_GQA, variant)
    paths["interleaved"] = root / "interleaved.mlpackage"
    mlmodel.save(str(paths["interleaved"]))
    for name in ("repeat_kv", "interleaved"):
        paths[f"{name}_folded"] = root / f"{name}_folded.mlpackage"
    return paths


@pytest.fixture(scope="module")
def fold_reports(packages: dict[str, Path]):  # noqa: ANN201
    with quiet_coremltools():
        return {
            name: fold_mlpackage(packages[name], packages[f"{name}_folded"])
            for name in ("repeat_kv", "interleaved")
        }


def test_fold_of_the_repeat_kv_build_equals_the_native_fold(packages, fold_reports) -> None:  # noqa: ANN001
    report = fold_reports["repeat_kv"]
    layers = TINY_GQA.num_layers
    assert (report.fold.found, report.fold.rewritten, report.fold.refused) == (layers, layers, 0)
    assert {pattern.head_mapping for pattern in report.fold.patterns} == {"h // G"}
    assert report.before.tile_ops == 2 * layers and report.after.tile_ops == 0
    native = analyze_mlpackage(packages["folded"])
    assert report.after.op_counts == native.op_counts
    assert report.after.ops_total == native.ops_total
    assert report.after.bytes_per_token == native.bytes_per_token
    text = render(report)
    assert f"{layers} found, {layers} rewritten, 0 refused" in text
    assert "tile ops       4 (1.0 MiB) -> 0 (0.0 MiB)" in text

    result = verify_packages(packages["repeat_kv"], packages["repeat_kv_folded"], STEPS)
    assert result.agree and result.first_divergent_step is None
    assert result.tokens_a == result.tokens_b and len(result.tokens_a) == STEPS
    assert result.max_rel_diff <= FP16_TWO_ULPS
    assert verify_packages(packages["folded"], packages["repeat_kv_folded"], STEPS).agree


def test_x_repeat_decoder_folds_with_the_interleaved_mapping(packages, fold_reports) -> None:  # noqa: ANN001
    report = fold_reports["interleaved"]
    layers = TINY_GQA.num_layers
    assert report.fold.rewritten == layers and report.fold.refused == 0
    assert {pattern.head_mapping for pattern in report.fold.patterns} == {"h % Hkv"}
    assert report.before.tile_ops == 2 * layers and report.after.tile_ops == 0
    assert report.after.bytes_per_token.redundant == 0
    assert (
        report.after.bytes_per_token.total
        == analyze_mlpackage(packages["folded"]).bytes_per_token.total
    )

    same = verify_packages(packages["interleaved"], packages["interleaved_folded"], STEPS)
    assert same.agree and same.max_rel_diff <= FP16_TWO_ULPS
    # Same weights, other head mapping: a different function, and verify must say so.
    different = verify_packages(packages["interleaved_folded"], packages["folded"], STEPS)
    assert not different.agree and different.first_divergent_step == 0
    assert different.max_abs_diff > 10 * different.atol


def test_folded_x_repeat_program_matches_its_pytorch_model(packages, fold_reports) -> None:  # noqa: ANN001
    prompt = [7, 3, 9]
    expected_tokens, expected_logits = greedy_decode(
        interleaved_model(torch.float32), prompt, STEPS
    )
    session = open_session(packages["interleaved_folded"])
    token, generated = prompt[0], []
    for position, reference in enumerate(expected_logits):
        logits = session.step(token, position)
        np.testing.assert_allclose(logits, reference.numpy(), atol=1e-2)
        if position + 1 < len(prompt):
            token = prompt[position + 1]
        else:
            token = int(np.argmax(logits))
            generated.append(token)
    assert generated == expected_tokens
    session.reset()  # a fresh cache: the first step again, as a harness token source sees it
    assert session.next_token(prompt[0], 0) == int(np.argmax(expected_logits[0].numpy()))
