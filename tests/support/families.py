"""Tiny checkpoints of each model family, made by transformers' own classes, and the proofs
each family's test runs on them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from decodebench.building.weights import load_checkpoint
from decodebench.contracts.domain import Attention, KVCache

transformers = pytest.importorskip("transformers")

MASSIVE_CHANNELS = (3, 11)
MASSIVE_SIGNS = (1.0, -1.0)
# The two package variants each family builds: both layouts, and both KV modes between them.
VARIANTS = ((Attention.repeat_kv, KVCache.state), (Attention.folded, KVCache.input))
# Each step's top-1/top-2 gap, as a fraction of its largest |logit|: fp16 keeps 11 bits, so
# rounding moves a logit by well under 0.1% of that scale; 1% cannot be flipped by rounding.
MIN_MARGIN = 0.01
# Ordinary embedding channels and the layers' norm gain: large enough that a token still moves
# the normalised stream next to the massive channels (whose RMS the norms divide by).
EMBED_STD = 20.0
LAYER_NORM_GAIN = 10.0


def tiny_checkpoint(
    folder: Path,
    config_class: str,
    model_class: str,
    fields: dict[str, Any],
    seed: int,
    norm_weight: Callable[[float], float] = lambda value: value,
    embed_scale: float = 1.0,
    output_norm_gain: float | None = None,
) -> Path:
    """Save a seeded random checkpoint of a transformers class, with massive channels.

    ``norm_weight`` maps the wanted effective norm gain to the stored weight (Gemma stores
    ``gain - 1``); ``embed_scale`` is what the model multiplies embeddings by (Gemma:
    sqrt(hidden)), so the residual stream holds the same values in every family.
    ``output_norm_gain`` is the gain of norms named ``post_*`` where they normalise a sub-block's
    output (Gemma): large enough that the layers, not the token's own embedding, decide.
    """
    config = getattr(transformers, config_class)(**fields, pad_token_id=0, eos_token_id=None)
    torch.manual_seed(seed)
    model = getattr(transformers, model_class)(config).eval()
    generator = torch.Generator().manual_seed(seed)
    hidden = config.hidden_size
    with torch.no_grad():
        embed = model.get_input_embeddings().weight
        # Ordinary channels of a visible size next to the massive ones, so the tokens still
        # differ after the norms divide by the massive RMS.
        embed.normal_(0.0, EMBED_STD / embed_scale, generator=generator)
        for channel, sign in zip(MASSIVE_CHANNELS, MASSIVE_SIGNS, strict=True):
            values = torch.empty(embed.shape[0]).uniform_(300.0, 500.0, generator=generator)
            embed[:, channel] = sign * values / embed_scale
        for name, parameter in model.named_parameters():
            if parameter.dim() == 1 and "norm" in name and parameter.shape[0] == hidden:
                final = name == "model.norm.weight"
                gain = 1.0 if final else LAYER_NORM_GAIN
                if output_norm_gain is not None and ".post_" in name:
                    gain = output_norm_gain
                parameter.fill_(norm_weight(gain))
                for channel in MASSIVE_CHANNELS:
                    parameter[channel] = norm_weight(1e-3 if final else 0.05)
    model.save_pretrained(folder)
    return folder


def reference_logits(folder: Path, tokens: list[int]) -> torch.Tensor:
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(folder), dtype=torch.float32, attn_implementation="eager"
    )
    with torch.no_grad():
        return model.eval()(torch.tensor([tokens])).logits[0]


def margins(logits: torch.Tensor) -> torch.Tensor:
    """Each row's top-1/top-2 gap relative to its largest |logit|."""
    top = logits.topk(2, dim=-1).values
    return (top[:, 0] - top[:, 1]) / logits.abs().amax(-1)


def check_pytorch_decoder(folder: Path, prompt: list[int], steps: int, context: int) -> None:
    """Our decoder (fp32, both layouts, both KV modes, prefill chunks then decode) gives
    transformers' logits along its greedy path."""
    from decodebench.modeling import build_model, greedy_decode

    config, tensors = load_checkpoint(folder, dtype=torch.float32)
    expected = None
    for attention in Attention:
        for kv in KVCache:
            model = build_model(config, context, attention, kv=kv, weights=tensors)
            # Prefill chunks of 3 in front of decode: the in-graph masks of a chunk's rows too.
            tokens, logits = greedy_decode(model, prompt, steps, prefill=model.sibling(3))
            if expected is None:
                expected = reference_logits(folder, prompt + tokens[:-1])
            # fp32 rounding of logits in the hundreds: tolerance relative to their scale.
            scale = float(expected.abs().max())
            torch.testing.assert_close(torch.stack(logits), expected, rtol=1e-4, atol=1e-4 * scale)


def check_packages(
    folder: Path,
    prompt: list[int],
    steps: int,
    context: int,
    out: Path,
    variants: tuple[dict[str, Any], ...] = (),
) -> list[int]:
    """fp16 packages built from ``folder`` decode transformers fp32's greedy tokens exactly:
    both layouts and KV modes, and each of ``variants`` (more VariantSpec fields)."""
    from decodebench.building.agreement import measure_agreement
    from decodebench.building.build import PACKAGE_NAME, build_variant
    from decodebench.building.reference import reference_outputs
    from decodebench.contracts.domain import VariantSpec
    from decodebench.formats.coreml.program import quiet_coremltools

    (expected,) = reference_outputs(folder, [prompt], steps)
    along = reference_logits(folder, prompt + expected[:-1])[len(prompt) - 1 :]
    assert len(set(expected)) > 3, expected  # a varied path, or equality proves little
    assert float(margins(along).min()) > MIN_MARGIN, margins(along)
    specs = [{"attention": attention, "kv": kv} for attention, kv in VARIANTS] + list(variants)
    for fields in specs:
        variant = VariantSpec(**fields, context=context)
        target = out / variant.label
        with quiet_coremltools():
            build_variant(folder.name, variant, target, weights=folder)
        report = measure_agreement(target / PACKAGE_NAME, [prompt], [expected], steps)
        assert report.non_finite == 0, report
        assert report.prompts[0].tokens == expected, (variant.label, report.prompts[0])
    return expected


def check_windowed_decoder(folder: Path, prompt: list[int], steps: int, context: int) -> None:
    """With ``kv_window`` (sliding layers keep a ring of their window) our fp32 decoder gives
    transformers' logits along its greedy path, past the window."""
    from decodebench.modeling import build_model, greedy_decode

    config, tensors = load_checkpoint(folder, dtype=torch.float32)
    assert config.sliding_window is not None and len(prompt) > config.sliding_window
    for attention in Attention:
        model = build_model(config, context, attention, weights=tensors, kv_window=True)
        slots = {tuple(getattr(model, name).shape)[2] for name in model.sliding_cache_names()}
        assert slots == {config.sliding_window}  # a ring of the window, not the context
        tokens, logits = greedy_decode(model, prompt, steps)
        expected = reference_logits(folder, prompt + tokens[:-1])
        scale = float(expected.abs().max())
        torch.testing.assert_close(torch.stack(logits), expected, rtol=1e-4, atol=1e-4 * scale)


# A Qwen3 of two narrow layers (head_dim its own figure, q/k norms, tied embeddings): an upload
# that builds in seconds.
QWEN3_FIELDS: dict[str, Any] = {
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "tie_word_embeddings": True,
    "rope_theta": 10_000.0,
    "max_position_embeddings": 256,
    "initializer_range": 0.3,
}


def qwen3_checkpoint(folder: Path, seed: int = 0) -> Path:
    """A tiny Qwen3 checkpoint saved by transformers' Qwen3ForCausalLM (massive channels too)."""
    return tiny_checkpoint(folder, "Qwen3Config", "Qwen3ForCausalLM", QWEN3_FIELDS, seed)
