"""`decodebench verify` on packages whose KV cache is passed in and out as inputs and outputs
(the layout before Core ML states), against each other and against the stateful layout of the
same weights: a small transformers Llama converted by the recipe both ways."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from decodebench.cli import main

pytestmark = pytest.mark.slow  # converts models

CONTEXT = 32


def tiny_llama(seed: int) -> object:
    """A random 2-layer GQA Llama with an untied head: its greedy tokens vary step to step."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    import coremltools as ct
    from coremltools.converters.mil import Builder as mb
    from coremltools.converters.mil.mil import types

    from decodebench.formats.coreml.program import quiet_coremltools
    from decodebench.formats.coreml.recipe import convert_model

    root = tmp_path_factory.mktemp("verify-cache-io")
    paths = {}
    with quiet_coremltools():
        model = tiny_llama(seed=5)
        for layout in ("io", "state"):
            paths[layout] = root / f"{layout}.mlpackage"
            convert_model(model, paths[layout], layout, CONTEXT)
        paths["other"] = root / "other-weights.mlpackage"
        convert_model(tiny_llama(seed=6), paths["other"], "io", CONTEXT)

        # Neither layout: a token in, logits out, no states and no cache input.
        table = np.random.default_rng(0).standard_normal((128, 16)).astype(np.float16)

        @mb.program(input_specs=[mb.TensorSpec((1, 1), types.int32)], opset_version=ct.target.iOS18)
        def stateless(input_ids):
            hidden = mb.gather(x=table, indices=input_ids, axis=0)
            return mb.matmul(x=hidden, y=table, transpose_y=True, name="logits")

        neither = ct.convert(stateless, convert_to="mlprogram", skip_model_load=True,
                             minimum_deployment_target=ct.target.iOS18)  # fmt: skip
        paths["neither"] = root / "neither.mlpackage"
        neither.save(str(paths["neither"]))
    return paths


def verify(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict, str]:
    code = main(["verify", *argv, "--json"])
    captured = capsys.readouterr()
    return code, json.loads(captured.out), captured.err


def test_io_against_io_is_identical(packages, capsys, tmp_path: Path) -> None:  # noqa: ANN001
    code, result, _ = verify(capsys, str(packages["io"]), str(packages["io"]), "--steps", "8")
    assert code == 0 and result["agree"]
    assert result["max_abs_diff"] == 0.0 and result["tokens_a"] == result["tokens_b"]
    assert len(set(result["tokens_a"])) > 1  # the cache fed back changes the next token
    interface = result["interface_a"]
    assert interface["caches"] == {"key_cache": "key_cache_out", "value_cache": "value_cache_out"}
    assert interface["states"] == [] and interface["context"] == CONTEXT
    assert (interface["token"], interface["position"], interface["mask"]) == (
        "input_ids",
        "position",
        "causal_mask",
    )

    # An --inputs mapping works as for a stateful program; the caches' outputs are not logits.
    mapping = tmp_path / "inputs.json"
    mapping.write_text(json.dumps({"token": "input_ids", "logits": "logits"}))
    code, mapped, _ = verify(
        capsys, str(packages["io"]), str(packages["io"]), "--inputs", str(mapping)
    )
    assert code == 0 and mapped["interface_a"] == interface
    mapping.write_text(json.dumps({"b": {"logits": "key_cache_out"}}))
    code, _, err = verify(
        capsys, str(packages["io"]), str(packages["io"]), "--inputs", str(mapping)
    )
    assert code == 2 and "no output 'key_cache_out'; outputs are logits" in err


def test_io_against_state_of_the_same_weights(packages, capsys) -> None:  # noqa: ANN001
    a, b = str(packages["io"]), str(packages["state"])
    code, result, _ = verify(capsys, a, b, "--steps", "12", "--prompt", "7,3,99,41,5")
    assert code == 0 and result["agree"], result
    assert result["tokens_a"] == result["tokens_b"]
    assert result["max_abs_diff"] <= result["atol"]
    assert result["interface_b"]["states"] and not result["interface_b"]["caches"]
    code, backwards, _ = verify(capsys, b, a, "--steps", "12", "--prompt", "7,3,99,41,5")
    assert code == 0 and backwards["tokens_a"] == result["tokens_a"]

    # The comparison can fail: other weights in the same layout diverge at the first step.
    code, result, _ = verify(capsys, str(packages["other"]), b, "--steps", "4")
    assert code == 1 and result["first_divergent_step"] == 0
    assert result["max_abs_diff"] > result["atol"]

    # The text report says which layout each program has.
    assert main(["verify", a, b, "--steps", "2"]) == 0
    out = capsys.readouterr().out
    assert "cache inputs/outputs=2" in out and "states=4" in out


def test_errors_are_the_stateful_ones(packages, capsys, massive_llama_io_package) -> None:  # noqa: ANN001
    code, result, err = verify(capsys, str(packages["neither"]), str(packages["io"]))
    assert code == 2
    assert "neither layout of a KV cache" in err and "input_ids [1, 1]" in err
    assert "neither layout of a KV cache" in result["error"]

    code, _, err = verify(capsys, str(packages["io"]), str(packages["io"]), "--steps", "40")
    assert code == 2 and f"exceed the context of {CONTEXT}" in err

    # An fp16 overflow in a KV-as-I/O program is named as in a stateful one.
    code, result, _ = verify(capsys, str(massive_llama_io_package), str(packages["io"]))
    assert code == 1 and not result["agree"]
    assert result["non_finite"].startswith(f"{massive_llama_io_package}: op #")
    assert "(pow -> " in result["non_finite"] and "infinity" in result["non_finite"]
