"""What each family reads from a Hugging Face ``config.json`` beyond the fields all share.

:func:`family_fields` returns extra :class:`~decodebench.contracts.presets.ModelConfig` fields, or raises
:class:`ConfigError` naming the key it cannot build faithfully. No torch here: the server checks
uploads with it.
"""

from __future__ import annotations

from typing import Any

# The MLP activation each family's decoder computes, as Hugging Face names it.
GELU_TANH = ("gelu_pytorch_tanh", "gelu_tanh")


class ConfigError(ValueError):
    """A config key the decoder cannot build faithfully; the message names it."""


def _layers(config: dict[str, Any]) -> int:
    if "num_hidden_layers" not in config:
        raise ConfigError("num_hidden_layers is missing")
    return int(config["num_hidden_layers"])


def _flags(config: dict[str, Any], key: str, layers: int) -> tuple[int, ...]:
    listed = config[key]
    if len(listed) != layers or any(flag not in (0, 1) for flag in listed):
        raise ConfigError(f"{key} must hold {layers} flags of 0 or 1")
    return tuple(int(flag) for flag in listed)


def _smollm3(config: dict[str, Any]) -> dict[str, Any]:
    """Layers without RoPE: listed, or every ``no_rope_layer_interval``-th layer."""
    layers = _layers(config)
    if config.get("no_rope_layers") is None:
        interval = int(config.get("no_rope_layer_interval", 4))
        return {"no_rope_layers": tuple(int((i + 1) % interval != 0) for i in range(layers))}
    return {"no_rope_layers": _flags(config, "no_rope_layers", layers)}


def _phi3(config: dict[str, Any]) -> dict[str, Any]:
    """Phi-3 sets ``sliding_window``; one at least the model's positions never drops a key."""
    window = config.get("sliding_window")
    positions = int(config.get("max_position_embeddings") or 0)
    if window is not None and int(window) < positions:
        raise ConfigError(
            f"sliding_window={window} is not supported "
            f"(narrower than max_position_embeddings {positions})"
        )
    return {}


def _gemma3(config: dict[str, Any]) -> dict[str, Any]:
    activation = config.get("hidden_activation") or config.get("hidden_act") or GELU_TANH[0]
    if activation not in GELU_TANH:
        raise ConfigError(f"hidden_activation={activation!r} is not supported (gelu_pytorch_tanh)")
    layers = _layers(config)
    types = config.get("layer_types")
    if types is None:
        pattern = int(config.get("sliding_window_pattern", 6))
        sliding = tuple(int(bool((i + 1) % pattern)) for i in range(layers))
    else:
        unknown = sorted(set(types) - {"sliding_attention", "full_attention"})
        if unknown or len(types) != layers:
            raise ConfigError(f"layer_types must name {layers} full or sliding layers")
        sliding = tuple(int(kind == "sliding_attention") for kind in types)
    window = config.get("sliding_window")
    if any(sliding) and window is None:
        raise ConfigError("sliding_window is missing")
    parameters = config.get("rope_parameters")
    local = parameters.get("sliding_attention") if isinstance(parameters, dict) else None
    if isinstance(local, dict) and local.get("rope_type", "default") != "default":
        raise ConfigError("rope_parameters.sliding_attention.rope_type is not supported")
    local_theta = (local or {}).get("rope_theta", config.get("rope_local_base_freq", 10_000.0))
    if config.get("use_bidirectional_attention"):
        raise ConfigError("use_bidirectional_attention is not supported (a causal decoder)")
    return {
        "sliding_layers": sliding,
        "sliding_window": int(window) if window is not None else None,
        "rope_local_theta": float(local_theta),
        "query_pre_attn_scalar": float(config.get("query_pre_attn_scalar", 256)),
        # transformers' Gemma 3 reads attn_logit_softcapping but never applies it (Gemma 2
        # did); the reference is what we match, so it is not read here either.
        "final_logit_softcapping": config.get("final_logit_softcapping"),
    }


READERS = {"smollm3": _smollm3, "phi3": _phi3, "gemma3": _gemma3}


def family_fields(config: dict[str, Any], family: str) -> dict[str, Any]:
    reader = READERS.get(family)
    return reader(config) if reader is not None else {}
