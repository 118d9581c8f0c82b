"""Packages converted the way Apple's public "Llama on Core ML" recipe converts them.

The recipe traces transformers' own Llama modules (``LlamaDecoderLayer`` and all) with the KV
cache held in registered buffers, and converts with coremltools' default passes in fp16. Those
passes drop the fp32 upcast transformers' ``LlamaRMSNorm`` makes, so ``x ** 2`` runs in fp16: on
SmolLM2-135M it overflows (layer 2's input norm reaches 84,390 > 65,504). That package is the
test case of the diagnosis and of ``decodebench repair``; nothing of the project's own modeling
code takes part in it.

Two layouts:

- ``state``: every layer's K and V cache a Core ML state (``key_cache_{i}`` / ``value_cache_{i}``),
  the layout of iOS 18 (:mod:`decodebench.formats.coreml.hf` converts both);
- ``io``: the older layout, one K and one V cache for all layers passed in as model inputs
  (``key_cache`` / ``value_cache`` ``[layers, 1, kv heads, context, head dim]``) and passed out
  again whole, updated (``key_cache_out`` / ``value_cache_out``): the whole cache crosses memory
  twice per token.

The one difference from the recipe: it sizes the query and the mask from flexible input shapes,
which the reference interpreter cannot run; here the step is one token at a ``position`` input
with a full-context additive mask (a mask the waste list names).

Converted packages are kept under ``~/.cache/decodebench/recipe`` (or
``$DECODEBENCH_RECIPE_CACHE``), keyed by the checkpoint, the layout, the context and the
installed torch / transformers / coremltools, so a test session converts each once.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

CACHE_ENV = "DECODEBENCH_RECIPE_CACHE"
LAYOUTS = ("state", "io")


def recipe_cache_root() -> Path:
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".cache" / "decodebench" / "recipe"


def _checkpoint_identity(folder: Path) -> str:
    digest = hashlib.sha256()
    for name in ("config.json", "model.safetensors"):
        path = folder / name
        digest.update(name.encode())
        digest.update(str(path.stat().st_size).encode())
        digest.update(str(int(path.stat().st_mtime)).encode())
    return digest.hexdigest()[:16]


def _toolchain() -> str:
    import coremltools
    import torch
    import transformers

    return f"torch{torch.__version__}-tf{transformers.__version__}-ct{coremltools.__version__}"


def recipe_package(folder: Path, layout: str = "state", context: int = 256) -> Path:
    """The checkpoint ``folder`` converted by the recipe (cached; converted on first use)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    key = hashlib.sha256(
        json.dumps([_checkpoint_identity(folder), layout, context, _toolchain()]).encode()
    ).hexdigest()[:16]
    root = recipe_cache_root()
    root.mkdir(parents=True, exist_ok=True)
    target = root / f"{folder.name}-{layout}-ctx{context}-{key}.mlpackage"
    with (root / f".{target.name}.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not target.exists():
            with tempfile.TemporaryDirectory(dir=root, prefix=".converting-") as staging:
                staged = Path(staging) / target.name
                convert_recipe(folder, staged, layout, context)
                os.replace(staged, target)
    return target


def load_fp32_model(folder: Path) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    return model.eval()


def convert_recipe(folder: Path, target: Path, layout: str = "state", context: int = 256) -> None:
    """Trace transformers' model from ``folder`` in fp32 and convert it to fp16 at ``target``."""
    model = load_fp32_model(folder)
    convert_model(model, target, layout, context)


def convert_model(model: Any, target: Path, layout: str = "state", context: int = 256) -> None:
    from decodebench.formats.coreml.hf import (
        StaticCacheDecodeStep,
        convert_cache_as_inputs,
        convert_decode_step,
        replace_directory,
    )

    if layout == "state":
        mlmodel = convert_decode_step(StaticCacheDecodeStep(model, context))
    else:
        mlmodel = convert_cache_as_inputs(model, context)
    replace_directory(target)
    mlmodel.save(str(target))


def tiny_llama_with_massive_channel(
    peak: float = 400.0, layers: int = 3, vocab_size: int = 128
) -> Any:
    """A small random Llama (transformers) whose layer 1 writes one massive residual channel.

    Layer 0's MLP down-projection writes about ``peak`` into residual channel 9, so from layer 1's input norm on, x[9] is hundreds and x² passes 65,504 in fp16:
    the shape of SmolLM2's massive activations, in a model that converts in seconds.
    ``vocab_size`` 49,152 takes SmolLM2's token ids (its tokenizer's chat prompts).
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(3)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        mlp = model.model.layers[0].mlp
        # Channel 0 of every embedding is 1 (the others ~0.02), so after the post-attention
        # norm it is about 8 whatever the token: gate and up read it alone in channel 5,
        # silu(8) * 8 ~ 64, and the down-projection writes ~peak into residual channel 9.
        model.model.embed_tokens.weight[:, 0] = 1.0
        for projection in (mlp.gate_proj, mlp.up_proj):
            projection.weight[5].fill_(0.0)
            projection.weight[5, 0] = 1.0
        mlp.down_proj.weight[9].fill_(0.0)
        mlp.down_proj.weight[9, 5] = peak / 64
    return model
