"""A program the project did not write: one decode step of transformers' own LlamaForCausalLM
with a StaticCache, converted as is. The interpreter must reproduce transformers; the fold must
remove every replication, standalone and inside ct.convert, without changing a token."""

from __future__ import annotations

from pathlib import Path

import coremltools as ct
import numpy as np
import pytest
import torch

from decodebench.formats.coreml.fold import PASS_NAME
from decodebench.formats.coreml.fold_package import fold_mlpackage
from decodebench.formats.coreml.hf import StaticCacheDecodeStep, convert_decode_step
from decodebench.formats.coreml.program import quiet_coremltools
from decodebench.formats.coreml.verify import open_session, verify_packages

pytestmark = pytest.mark.slow

CONTEXT = 32
LAYERS = 2
PROMPT = [1, 2, 3, 4]
STEPS = 8


@pytest.fixture(scope="module")
def llama():  # noqa: ANN201
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=LAYERS,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=CONTEXT,
        attn_implementation="eager",  # matmul + repeat_kv, as in transformers' reference code
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def packages(llama, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:  # noqa: ANN001
    root = tmp_path_factory.mktemp("llama")
    step = StaticCacheDecodeStep(llama, CONTEXT)
    pipeline = ct.PassPipeline.DEFAULT
    pipeline.append_pass(PASS_NAME)
    paths = {"plain": root / "llama.mlpackage", "pipeline": root / "llama_pipeline.mlpackage"}
    with quiet_coremltools():
        convert_decode_step(step).save(str(paths["plain"]))
        convert_decode_step(step, pipeline).save(str(paths["pipeline"]))
    paths["folded"] = root / "llama_folded.mlpackage"
    return paths


def test_interpreter_reproduces_transformers(llama, packages) -> None:  # noqa: ANN001
    # transformers' own greedy generation (prefill + static cache) is the oracle for tokens.
    with torch.no_grad():
        generated = llama.generate(
            torch.tensor([PROMPT]),
            max_new_tokens=STEPS,
            do_sample=False,
            cache_implementation="static",
            pad_token_id=0,
        )
    expected_tokens = generated[0, len(PROMPT) :].tolist()

    step = StaticCacheDecodeStep(llama, CONTEXT)
    session = open_session(packages["plain"])
    token, tokens = PROMPT[0], []
    for position in range(len(PROMPT) + STEPS - 1):
        mask = torch.full((1, 1, 1, CONTEXT), float("-inf"))
        mask[..., : position + 1] = 0
        with torch.no_grad():
            reference = step(torch.tensor([[token]]), torch.tensor([position]), mask)[0, -1].numpy()
        logits = session.step(token, position)
        np.testing.assert_allclose(logits, reference, atol=5e-3)
        if position + 1 < len(PROMPT):
            token = PROMPT[position + 1]
        else:
            token = int(np.argmax(logits))
            tokens.append(token)
    assert tokens == expected_tokens


def test_fold_removes_every_replication_and_keeps_every_token(packages) -> None:  # noqa: ANN001
    with quiet_coremltools():
        report = fold_mlpackage(packages["plain"], packages["folded"])
    assert report.before.tile_ops == 2 * LAYERS
    assert report.after.tile_ops == 0
    # Every redundant copy left is one the fold does not touch (RoPE's cat(freqs, freqs)).
    assert report.after.redundant_ops == [
        copy for copy in report.before.redundant_ops if copy.kind != "tile"
    ]
    assert (report.fold.found, report.fold.rewritten) == (LAYERS, LAYERS)
    assert {pattern.head_mapping for pattern in report.fold.patterns} == {"h // G"}
    assert (
        report.before.op_counts["expand_dims"] - report.after.op_counts.get("expand_dims", 0)
        == 2 * LAYERS
    )

    result = verify_packages(packages["plain"], packages["folded"], STEPS, PROMPT)
    assert result.agree, result
    assert result.tokens_a == result.tokens_b
    assert result.max_abs_diff <= 1e-3


def test_fold_inside_ct_convert_matches_the_standalone_fold(packages) -> None:  # noqa: ANN001
    from decodebench.analysis.analyze import analyze_mlpackage

    in_pipeline = analyze_mlpackage(packages["pipeline"])
    assert in_pipeline.tile_ops == 0
    assert in_pipeline.bytes_per_token == analyze_mlpackage(packages["folded"]).bytes_per_token
    assert verify_packages(packages["plain"], packages["pipeline"], STEPS, PROMPT).agree
