"""transformers fp32 as one more decoder in the proof: the checkpoint a package was made from.

A folder holding a checkpoint (``config.json`` and ``*.safetensors``, a Hugging Face folder) is
loaded with transformers in fp32 and stepped one token at a time with its own KV cache, the
same loop the package's sessions follow (:mod:`decodebench.formats.coreml.cache_io`), so the proof can
compare it with the package's fp32 run and with the repaired package at every step.

A checkpoint whose vocabulary, layer count or hidden width is not the package's is refused with
what differs: its tokens would mean something else.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import numpy as np

from decodebench.formats.coreml.program import MilError


def has_checkpoint(folder: Path | str | None) -> bool:
    """A Hugging Face checkpoint: a config and safetensors weights (not only a tokenizer)."""
    if folder is None:
        return False
    path = Path(folder)
    return (path / "config.json").is_file() and any(path.glob("*.safetensors"))


class TransformersSession:
    """transformers' fp32 model stepped one token at a time (a decode session)."""

    def __init__(self, model: Any, label: str) -> None:
        self.model = model
        self.label = label
        self.cache: Any = None
        self.length = 0
        # transformers 5 names the KV cache ``cache``; earlier releases ``past_key_values``.
        parameters = inspect.signature(model.forward).parameters
        self.cache_name = "cache" if "cache" in parameters else "past_key_values"

    def reset(self) -> None:
        self.cache = None
        self.length = 0

    def step(self, token: int, position: int) -> np.ndarray:
        import torch

        if position != self.length:
            raise MilError(f"{self.label}: step at position {position} after {self.length}")
        threads = torch.get_num_threads()
        # One thread, as the interpreter's steps: torch's pool spins while they run.
        torch.set_num_threads(1)
        try:
            with torch.no_grad():
                output = self.model(
                    torch.tensor([[int(token)]]), use_cache=True, **{self.cache_name: self.cache}
                )
        finally:
            torch.set_num_threads(threads)
        self.cache = output[self.cache_name]
        self.length += 1
        return np.asarray(output.logits[0, -1].float().numpy(), dtype=np.float32)


def load_checkpoint(
    folder: Path | str, vocab: int, layers: int | None, hidden: int | None
) -> TransformersSession:
    """The checkpoint in ``folder`` as a session, refused unless its shape is the package's."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    path = Path(folder)
    if not has_checkpoint(path):
        raise MilError(f"{path} holds no checkpoint (config.json and *.safetensors)")
    try:
        config = AutoConfig.from_pretrained(str(path))
    except (OSError, ValueError, KeyError) as error:
        raise MilError(f"{path}: transformers cannot read its config.json ({error})") from None
    text = getattr(config, "get_text_config", lambda: config)()
    found = {
        "vocabulary": getattr(text, "vocab_size", None),
        "layers": getattr(text, "num_hidden_layers", None),
        "hidden size": getattr(text, "hidden_size", None),
    }
    expected = {"vocabulary": vocab, "layers": layers, "hidden size": hidden}
    wrong = [
        f"{what} {found[what]} (the package's: {want})"
        for what, want in expected.items()
        if want is not None and found[what] is not None and found[what] != want
    ]
    if wrong:
        raise MilError(f"{path} is not the package's checkpoint: its " + ", ".join(wrong))
    try:
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    except (OSError, ValueError, KeyError) as error:
        raise MilError(f"{path}: transformers cannot load it as a causal LM ({error})") from None
    return TransformersSession(model, f"{path} (transformers fp32)")
