"""The PyTorch reference decoder as a harness step engine (torch is imported on first use).

Same preset, same seeded weights, same attention layout as the build, so its greedy tokens are
what the converted model should produce (up to fp16 rounding in Core ML).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import TYPE_CHECKING

from decodebench.contracts.domain import VariantSpec
from decodebench.contracts.presets import ModelConfig, get_preset
from decodebench.timing import TokenSource

if TYPE_CHECKING:
    import torch

    from decodebench.modeling import DecodeStepModel, HostCache


def resolve_config(model: str, variant: VariantSpec) -> ModelConfig:
    config = get_preset(model)
    if variant.layers is not None:
        config = config.model_copy(update={"num_layers": variant.layers})
    return config


def parameter_estimate(config: ModelConfig) -> int:
    """Parameters of the decoder without building it (norms and biases left out)."""
    hidden, head_dim = config.hidden_size, config.head_dim
    attention = (
        hidden * head_dim * (2 * config.num_attention_heads + 2 * config.num_key_value_heads)
    )
    mlp = 3 * hidden * config.intermediate_size
    embeddings = config.vocab_size * hidden * (1 if config.tie_word_embeddings else 2)
    return config.num_layers * (attention + mlp) + embeddings


class TorchStepEngine(TokenSource):
    """One decode step of `decodebench.modeling.DecodeStepModel`; greedy next token.

    (As a token source for emulated runs: "the PyTorch reference decoder".)

    Works for both KV layouts the builds have: the cache as module state (`kv="state"`), or
    host-owned (`kv="input"`), where the engine keeps the cache and writes each new K/V itself.
    """

    def __init__(self, model: DecodeStepModel) -> None:
        import torch

        from decodebench.modeling import HostCache, run_call

        self.model = model
        self._torch = torch
        self._run_call = run_call
        self._host_cache = HostCache
        self._host: HostCache | None = None
        self.source = "the PyTorch reference decoder (fp32, the build's seeded weights)"
        # The KV cache is engine state: one run at a time per engine.
        self.lock = threading.Lock()
        self.reset()

    @classmethod
    def build(
        cls, config: ModelConfig, variant: VariantSpec, dtype: torch.dtype | None = None
    ) -> TorchStepEngine:
        import torch

        from decodebench.modeling import build_model

        kv = getattr(variant, "kv", "state")
        model = build_model(
            config, variant.context, variant.attention, dtype or torch.float32, kv=kv,
            kv_window=getattr(variant, "kv_window", False),
        )  # fmt: skip
        return cls(model)

    def reset(self) -> None:
        self.model.reset_cache()
        self._host = self._host_cache(self.model) if str(self.model.kv) == "input" else None

    def step(self, token: int, position: int) -> int:
        with self._torch.inference_mode():
            logits = self._run_call(self.model, [token], position, self._host)
            return int(self._torch.argmax(logits[-1]))


class ReferenceCache:
    """Reference engines by (model, variant), a few at a time: building one costs its weights."""

    def __init__(self, capacity: int = 2) -> None:
        self._capacity = capacity
        self._engines: OrderedDict[tuple[str, str], TorchStepEngine] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, model: str, variant: VariantSpec) -> TorchStepEngine:
        key = (model, variant.model_dump_json(exclude={"name"}))
        with self._lock:
            engine = self._engines.pop(key, None)
            if engine is None:
                import torch

                # Reference tokens are a by-product of an emulated run: one intra-op thread
                # keeps them from fighting the agent (and other devices' runs) for the cores.
                torch.set_num_threads(1)
                engine = TorchStepEngine.build(resolve_config(model, variant), variant)
            self._engines[key] = engine
            while len(self._engines) > self._capacity:
                self._engines.popitem(last=False)
            return engine
