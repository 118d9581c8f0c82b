"""GGUF round trips of the families transformers' GGUF loader maps (Qwen3, Phi-3, Gemma 3): a
checkpoint made by transformers' own classes (massive-activation channels in the residual
stream) written as llama.cpp lays a GGUF out, then ``decodebench build --weights FILE.gguf``
dequantizes it once and the fp16 package decodes transformers fp32's greedy tokens; and what
the loader would misread, or cannot load, is refused by name."""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from decodebench.building.agreement import measure_agreement
from decodebench.building.build import PACKAGE_NAME
from decodebench.building.reference import reference_outputs
from decodebench.checkpoints import ModelFileError, check_gguf
from decodebench.cli import main
from decodebench.formats.coreml.program import quiet_coremltools
from tests.support.families import MIN_MARGIN, margins, reference_logits, tiny_checkpoint
from tests.support.gguf_files import write_gguf

transformers = pytest.importorskip("transformers")
pytest.importorskip("gguf")

CONTEXT = 64
PROMPT = [5, 9, 200, 31, 77, 4, 180, 23, 64, 130, 2, 99, 41, 250, 8, 17]
STEPS = 10
SHAPE = {
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": CONTEXT,
    "rms_norm_eps": 1e-6,
    "initializer_range": 0.2,
}


def _gemma_gain(gain: float) -> float:
    return gain - 1.0  # Gemma's RMSNorm multiplies by 1 + w


# Seeds picked for a varied greedy path with wide top-1/top-2 margins (MIN_MARGIN).
# What the GGUF metadata can say, and no more: transformers' loader takes the rest from its
# config defaults (Qwen3's head_dim 128, Gemma 3's query_pre_attn_scalar 256 and one global layer
# in six, Phi-3's full rotary and no LongRoPE), so the checkpoints are made that way.
FAMILIES: dict[str, dict[str, Any]] = {
    "qwen3": {
        "classes": ("Qwen3Config", "Qwen3ForCausalLM"),
        "fields": {**SHAPE, "num_hidden_layers": 2, "head_dim": 128, "tie_word_embeddings": True},
        "seed": 15,
    },
    "phi3": {
        "classes": ("Phi3Config", "Phi3ForCausalLM"),
        "fields": {**SHAPE, "num_hidden_layers": 2, "tie_word_embeddings": False},
        "seed": 1,
    },
    "gemma3": {
        "classes": ("Gemma3TextConfig", "Gemma3ForCausalLM"),
        "fields": {
            **SHAPE,
            "num_hidden_layers": 6,
            "head_dim": 16,
            "sliding_window": 8,
            "tie_word_embeddings": True,
        },
        "seed": 12,
        "norm_weight": _gemma_gain,
        "embed_scale": math.sqrt(SHAPE["hidden_size"]),
        "output_norm_gain": 40.0,
    },
}


def _checkpoint(root: Path, family: str) -> Path:
    spec = FAMILIES[family]
    config_class, model_class = spec["classes"]
    return tiny_checkpoint(
        root / f"tiny-{family}",
        config_class,
        model_class,
        spec["fields"],
        spec["seed"],
        spec.get("norm_weight", lambda value: value),
        spec.get("embed_scale", 1.0),
        spec.get("output_norm_gain"),
    )


def _gguf(folder: Path, family: str) -> Path:
    model = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    return write_gguf(model.eval(), folder.parent / f"{folder.name}.gguf", family)


def _build(gguf: Path, out: Path, cache: Path, *flags: str) -> int:
    with quiet_coremltools():
        return main(
            ["build", "--weights", str(gguf), "--context", str(CONTEXT), "--quiet",
             "--cache-dir", str(cache), "--out", str(out), *flags]
        )  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_gguf_builds_and_decodes_the_fp32_tokens(family: str, tmp_path: Path) -> None:
    folder = _checkpoint(tmp_path, family)
    (expected,) = reference_outputs(folder, [PROMPT], STEPS)
    along = reference_logits(folder, PROMPT + expected[:-1])[len(PROMPT) - 1 :]
    assert len(set(expected)) > 3, expected
    assert float(margins(along).min()) > MIN_MARGIN, margins(along)
    gguf = _gguf(folder, family)
    cache = tmp_path / "cache"
    assert _build(gguf, tmp_path / "folded", cache) == 0
    (converted,) = (cache / "gguf").iterdir()  # dequantized once ...
    stamp = (converted / "model.safetensors").stat().st_mtime_ns
    assert _build(gguf, tmp_path / "repeat_kv", cache, "--attention", "repeat_kv") == 0
    assert (converted / "model.safetensors").stat().st_mtime_ns == stamp  # ... and kept
    for layout in ("folded", "repeat_kv"):
        report = measure_agreement(tmp_path / layout / PACKAGE_NAME, [PROMPT], [expected], STEPS)
        assert report.non_finite == 0, report
        assert report.prompts[0].tokens == expected, (family, layout, report.prompts[0])


def _header(path: Path, metadata: dict[str, Any], architecture: str) -> io.BytesIO:
    """A GGUF file of no tensors and ``metadata``, written by the gguf package."""
    import gguf

    writer = gguf.GGUFWriter(str(path), architecture)
    for key, value in metadata.items():
        writer.add_key_value(key, value, gguf.GGUFValueType.get_type(value))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return io.BytesIO(path.read_bytes())


@pytest.mark.parametrize(
    ("architecture", "metadata", "message"),
    [
        ("smollm3", {}, "transformers' GGUF loader does not map SmolLM3"),
        ("exaone4", {}, "does not map EXAONE 4"),
        ("qwen3", {"qwen3.attention.key_length": 64}, "key_length=64 is not supported"),
        (
            "phi3",
            {
                "phi3.embedding_length": 3072,
                "phi3.attention.head_count": 24,
                "phi3.rope.dimension_count": 96,
            },
            "rope.dimension_count=96 of head_dim 128 (partial rotary)",
        ),
        ("phi3", {"phi3.rope.scaling.original_context_length": 4096}, "(LongRoPE) is not"),
    ],  # fmt: skip
)
def test_what_the_loader_cannot_read_is_refused_by_name(
    architecture: str, metadata: dict[str, Any], message: str, tmp_path: Path
) -> None:
    stream = _header(tmp_path / "m.gguf", metadata, architecture)
    with pytest.raises(ModelFileError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_gguf(stream, len(stream.getvalue()), "model.gguf")


def test_the_families_it_can_read_pass_the_header_check(tmp_path: Path) -> None:
    for architecture, metadata in (
        ("qwen3", {"qwen3.attention.key_length": 128}),
        ("phi3", {"phi3.embedding_length": 3072, "phi3.attention.head_count": 32,
                  "phi3.rope.dimension_count": 96}),
        ("gemma3", {"gemma3.attention.sliding_window": 512}),
    ):  # fmt: skip
        stream = _header(tmp_path / f"{architecture}.gguf", metadata, architecture)
        assert check_gguf(stream, len(stream.getvalue()), "m.gguf")["architecture"] == architecture


def test_cli_names_a_refused_gguf(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "smol.gguf"
    _header(path, {}, "smollm3")
    assert _build(path, tmp_path / "out", tmp_path / "cache") == 2
    assert "transformers' GGUF loader does not map SmolLM3" in capsys.readouterr().err
