"""Packages converted the way Apple's public "Llama on Core ML" recipe converts them.

The recipe traces transformers' own Llama modules (``LlamaDecoderLayer`` and all) with the KV
cache held in registered buffers, and converts with coremltools' default passes in fp16. Those
passes drop the fp32 upcast transformers' ``LlamaRMSNorm`` makes, so ``x ** 2`` runs in fp16: on
SmolLM2-135M it overflows (layer 2's input norm reaches 84,390 > 65,504). That package is the
test case of the diagnosis and of ``decodebench repair``; nothing of the project's own modeling
code takes part in it.

Two layouts:

- ``state``: every layer's K and V cache a Core ML state (``key_cache_{i}`` / ``value_cache_{i}``),
  the layout of iOS 18 (:mod:`decodebench.mil.hf` is the trace);
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
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

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
    from decodebench.mil.hf import StaticCacheDecodeStep, convert_decode_step

    if layout == "state":
        step = StaticCacheDecodeStep(model, context)
        mlmodel = convert_decode_step(step)
    else:
        mlmodel = _convert_io(model, context)
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists():
        shutil.rmtree(target)
    mlmodel.save(str(target))


def _convert_io(model: Any, context: int) -> Any:
    import coremltools as ct
    import torch

    from decodebench import coreml_compat
    from decodebench.mil import compat
    from decodebench.mil.hf import StaticCacheDecodeStep, example_inputs

    class CacheAsInputs(torch.nn.Module):
        """The step with the cache passed in and out instead of held (no buffers)."""

        def __init__(self) -> None:
            super().__init__()
            self.step = StaticCacheDecodeStep(model, context)

        def forward(
            self,
            input_ids: torch.Tensor,
            position: torch.Tensor,
            causal_mask: torch.Tensor,
            key_cache: torch.Tensor,
            value_cache: torch.Tensor,
        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            for index, layer in enumerate(self.step.layers):
                layer.keys = key_cache[index].clone()
                layer.values = value_cache[index].clone()
            logits = self.step(input_ids, position, causal_mask)
            keys = torch.stack([layer.keys for layer in self.step.layers])
            values = torch.stack([layer.values for layer in self.step.layers])
            return logits, keys, values

    wrapper = CacheAsInputs().eval()
    step = wrapper.step
    shape = (len(step.layers), 1, step.kv_heads, context, step.head_dim)
    caches = (torch.zeros(shape), torch.zeros(shape))
    compat.install()
    traced = coreml_compat.trace(wrapper, (*example_inputs(context), *caches))
    return ct.convert(
        traced,
        inputs=[
            ct.TensorType(name="input_ids", shape=(1, 1), dtype=np.int32),
            ct.TensorType(name="position", shape=(1,), dtype=np.int32),
            ct.TensorType(name="causal_mask", shape=(1, 1, 1, context), dtype=np.float16),
            ct.TensorType(name="key_cache", shape=shape, dtype=np.float16),
            ct.TensorType(name="value_cache", shape=shape, dtype=np.float16),
        ],
        outputs=[
            ct.TensorType(name="logits", dtype=np.float16),
            ct.TensorType(name="key_cache_out", dtype=np.float16),
            ct.TensorType(name="value_cache_out", dtype=np.float16),
        ],
        convert_to="mlprogram",
        minimum_deployment_target=ct.target.iOS18,  # the index_copy_ seam emits slice_update
        compute_precision=ct.precision.FLOAT16,
        skip_model_load=True,
    )


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


def convert_multifunction(
    model: Any,
    target: Path,
    context: int = 64,
    chunk: int = 4,
    names: tuple[str, str] = ("decode", "prefill"),
    prefill_model: Any | None = None,
) -> None:
    """``model`` as coremltools' multifunction save makes it: two conversions of the same
    weights (the recipe's one-token decode step, and a prefill step of ``chunk`` tokens whose
    causal mask is built in the graph from ``position``), merged into one package whose
    functions are ``names`` (decode first, the default), sharing the KV states.

    ``prefill_model``: another model of the same shape for the prefill function (a package
    whose prefill misbehaves where its decode step does not)."""
    import coremltools as ct
    import torch

    from decodebench import coreml_compat
    from decodebench.mil import compat
    from decodebench.mil.hf import StaticCacheDecodeStep, convert_decode_step

    class PrefillStep(StaticCacheDecodeStep):
        def forward(  # type: ignore[override]
            self, input_ids: torch.Tensor, position: torch.Tensor
        ) -> torch.Tensor:
            positions = position + torch.arange(chunk, dtype=position.dtype)
            columns = torch.arange(context, dtype=position.dtype)
            allowed = columns[None, :] <= positions[:, None]
            mask = torch.where(allowed, 0.0, float("-inf"))[None, None]
            for layer in self.layers:
                layer.cumulative_length = position.clone()
            output = self.model(
                input_ids=input_ids,
                attention_mask=mask,
                position_ids=positions[None],
                cache=self.cache,
                use_cache=True,
            )
            return output.logits

    decode_name, prefill_name = names
    with tempfile.TemporaryDirectory() as staging:
        parts = {decode_name: Path(staging) / "decode.mlpackage"}
        convert_decode_step(StaticCacheDecodeStep(model, context)).save(str(parts[decode_name]))
        prefill = PrefillStep(prefill_model or model, context).eval()
        compat.install()
        example = (torch.zeros((1, chunk), dtype=torch.int32), torch.zeros(1, dtype=torch.int32))
        traced = coreml_compat.trace(prefill, example)
        prefill.reset_cache()
        cache_shape = (1, prefill.kv_heads, context, prefill.head_dim)
        converted = ct.convert(
            traced,
            inputs=[
                ct.TensorType(name="input_ids", shape=(1, chunk), dtype=np.int32),
                ct.TensorType(name="position", shape=(1,), dtype=np.int32),
            ],
            outputs=[ct.TensorType(name="logits", dtype=np.float16)],
            states=[
                ct.StateType(
                    wrapped_type=ct.TensorType(shape=cache_shape, dtype=np.float16), name=name
                )
                for name in prefill.cache_names()
            ],
            convert_to="mlprogram",
            minimum_deployment_target=ct.target.iOS18,
            compute_precision=ct.precision.FLOAT16,
            skip_model_load=True,
        )
        parts[prefill_name] = Path(staging) / "prefill.mlpackage"
        converted.save(str(parts[prefill_name]))
        descriptor = ct.utils.MultiFunctionDescriptor()
        for name, path in parts.items():
            descriptor.add_function(str(path), src_function_name="main", target_function_name=name)
        descriptor.default_function_name = decode_name
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.exists():
            shutil.rmtree(target)
        ct.utils.save_multifunction(descriptor, str(target))
