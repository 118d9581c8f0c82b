"""Real weights: a Hugging Face style folder (``config.json`` + ``*.safetensors``) as a model.

:func:`load_checkpoint` maps the config onto a :class:`~decodebench.contracts.presets.ModelConfig` and
reads every tensor the decoder needs, refusing what it cannot build faithfully with an error that
names the offending key (``config.json: hidden_act`` or the tensor name). :func:`fingerprint`
identifies the folder's contents for the build key.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from pathlib import Path
from typing import Any

from decodebench.checkpoints import is_unused_tensor
from decodebench.contracts.presets import LongRopeScaling, ModelConfig, RopeScaling
from decodebench.modeling.families import FAMILIES, family_for
from decodebench.modeling.hf_fields import ConfigError, family_fields

ARCHITECTURES = {family.architecture: family.name for family in FAMILIES.values()}
# transformers' model_type of each family where it is not the family's name (Gemma 3's text-only
# model; "gemma3" is the multimodal one).
HF_MODEL_TYPES = {"gemma3": "gemma3_text"}
MODEL_TYPES = {HF_MODEL_TYPES.get(name, name): name for name in FAMILIES}
_HASH_CHUNK = 16 * 2**20


class WeightsError(ValueError):
    """The folder cannot be built as a decodebench model; the message names the key."""


def _read_config(folder: Path) -> dict[str, Any]:
    path = folder / "config.json"
    if not path.is_file():
        raise WeightsError(f"{folder}: no config.json")
    try:
        config = json.loads(path.read_text())
    except ValueError as error:
        raise WeightsError(f"{path}: not JSON ({error})") from None
    if not isinstance(config, dict):
        raise WeightsError(f"{path}: not a JSON object")
    return config


def _family(config: dict[str, Any]) -> str:
    architectures = config.get("architectures") or []
    for architecture in architectures:
        if architecture in ARCHITECTURES:
            return ARCHITECTURES[architecture]
    model_type = config.get("model_type")
    if not architectures and model_type in MODEL_TYPES:
        return MODEL_TYPES[model_type]
    supported = ", ".join(ARCHITECTURES)
    found = architectures or model_type
    raise WeightsError(
        f"config.json: architectures {found!r} not supported; supported: {supported}"
    )


def _require(config: dict[str, Any], key: str) -> Any:
    if key not in config:
        raise WeightsError(f"config.json: {key} is missing")
    return config[key]


def _refuse(config: dict[str, Any], key: str, supported: object, why: str) -> None:
    value = config.get(key, supported)
    if value != supported:
        raise WeightsError(f"config.json: {key}={value!r} is not supported ({why})")


def _rope_parameters(config: dict[str, Any]) -> tuple[dict[str, Any], str]:
    # transformers 5 writes `rope_parameters`; older checkpoints `rope_theta` + `rope_scaling`.
    parameters = dict(config.get("rope_scaling") or {})
    key = "rope_scaling"
    if isinstance(config.get("rope_parameters"), dict):
        parameters = {**parameters, **config["rope_parameters"]}
        key = "rope_parameters"
        if isinstance(parameters.get("full_attention"), dict):  # per layer type (Gemma 3)
            parameters = dict(parameters["full_attention"])
            key = "rope_parameters.full_attention"
    return parameters, key


def _partial_rotary_factor(config: dict[str, Any], family: str) -> float:
    parameters, key = _rope_parameters(config)
    factor = float(parameters.get("partial_rotary_factor", config.get("partial_rotary_factor", 1)))
    if factor != 1.0 and family != "phi3":
        raise WeightsError(f"config.json: {key}.partial_rotary_factor is not supported")
    return factor


def _rope(config: dict[str, Any]) -> tuple[float, RopeScaling | LongRopeScaling | None]:
    parameters, key = _rope_parameters(config)
    theta = float(parameters.get("rope_theta", config.get("rope_theta", 10_000.0)))
    rope_type = parameters.get("rope_type", parameters.get("type", "default"))
    if rope_type == "default":
        return theta, None
    if rope_type == "longrope":
        return theta, _longrope(config, parameters, key)
    if rope_type != "llama3":
        raise WeightsError(
            f"config.json: {key}.rope_type={rope_type!r} is not supported "
            "(default, llama3, longrope)"
        )
    try:
        scaling = RopeScaling(
            factor=parameters["factor"],
            low_freq_factor=parameters["low_freq_factor"],
            high_freq_factor=parameters["high_freq_factor"],
            original_max_position_embeddings=parameters["original_max_position_embeddings"],
        )
    except KeyError as missing:
        raise WeightsError(f"config.json: {key}.{missing.args[0]} is missing") from None
    return theta, scaling


def _longrope(config: dict[str, Any], parameters: dict[str, Any], key: str) -> LongRopeScaling:
    """transformers' reading: the attention factor defaults to sqrt(1 + ln s / ln original),
    s the context growth (``factor``, or max over original position embeddings)."""
    original = parameters.get(
        "original_max_position_embeddings", config.get("original_max_position_embeddings")
    )
    if original is None:
        raise WeightsError(f"config.json: {key}.original_max_position_embeddings is missing")
    factor = parameters.get("factor")
    if factor is None:
        factor = int(_require(config, "max_position_embeddings")) / int(original)
    attention_factor = parameters.get("attention_factor")
    if attention_factor is None:
        attention_factor = (
            1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(int(original)))
        )
    try:
        return LongRopeScaling(
            short_factor=tuple(parameters["short_factor"]),
            long_factor=tuple(parameters["long_factor"]),
            original_max_position_embeddings=int(original),
            attention_factor=float(attention_factor),
        )
    except KeyError as missing:
        raise WeightsError(f"config.json: {key}.{missing.args[0]} is missing") from None


def model_config_from_hf(config: dict[str, Any], name: str) -> ModelConfig:
    """The :class:`ModelConfig` of a Hugging Face ``config.json`` (refusing what we can't build)."""
    family = _family(config)
    if family != "gemma3":
        _refuse(config, "hidden_act", "silu", "the decoder's MLP is SiLU-gated")
    _refuse(config, "mlp_bias", False, "MLP projections have no bias")
    if family in ("llama", "qwen3", "smollm3", "phi3"):
        _refuse(config, "attention_bias", False, f"{family} projections have no bias")
    if family in ("qwen2", "qwen3", "smollm3"):
        _refuse(config, "use_sliding_window", False, "sliding-window attention")
    if family == "exaone4":
        layer_types = config.get("layer_types") or []
        if config.get("sliding_window") is not None and (
            not layer_types or any(kind != "full_attention" for kind in layer_types)
        ):
            raise WeightsError(
                "config.json: sliding_window is not supported (hybrid local/global attention)"
            )
    try:
        extra = family_fields(config, family)
    except ConfigError as error:
        raise WeightsError(f"config.json: {error}") from None
    heads = int(_require(config, "num_attention_heads"))
    hidden = int(_require(config, "hidden_size"))
    theta, scaling = _rope(config)
    try:
        return ModelConfig(
            name=name,
            family=family,  # type: ignore[arg-type]
            num_layers=int(_require(config, "num_hidden_layers")),
            hidden_size=hidden,
            intermediate_size=int(_require(config, "intermediate_size")),
            vocab_size=int(_require(config, "vocab_size")),
            num_attention_heads=heads,
            num_key_value_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or hidden // heads),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            rope_theta=theta,
            rope_scaling=scaling,
            rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
            **extra,
            partial_rotary_factor=_partial_rotary_factor(config, family),
        )
    except ValueError as error:
        raise WeightsError(f"config.json: {error}") from None


def hf_config_dict(config: ModelConfig, max_position_embeddings: int = 4096) -> dict[str, Any]:
    """The Hugging Face ``config.json`` of a :class:`ModelConfig` (the inverse mapping)."""
    architecture = {family: name for name, family in ARCHITECTURES.items()}[config.family]
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": config.rope_theta}
    if config.rope_scaling is not None:
        rope = {**config.rope_scaling.model_dump(mode="json"), "rope_theta": config.rope_theta}
    result: dict[str, Any] = {
        "architectures": [architecture],
        "model_type": HF_MODEL_TYPES.get(config.family, config.family),
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": config.rms_norm_eps,
        "tie_word_embeddings": config.tie_word_embeddings,
        "rope_parameters": rope,
        "max_position_embeddings": max_position_embeddings,
    }
    if config.family == "exaone4":
        # transformers 5.24 derives layer_types by dividing by the window pattern: pass them.
        result["sliding_window"] = None
        result["layer_types"] = ["full_attention"] * config.num_layers
    if config.family in ("qwen2", "qwen3", "smollm3"):
        result["use_sliding_window"] = False
    if config.family in ("qwen3", "smollm3"):
        result["attention_bias"] = False
    if config.no_rope_layers is not None:
        result["no_rope_layers"] = list(config.no_rope_layers)
    if config.partial_rotary_factor != 1.0:
        rope["partial_rotary_factor"] = config.partial_rotary_factor
    if isinstance(config.rope_scaling, LongRopeScaling):
        # Phi-3 reads the original context at the top level too (transformers 4 only there).
        result["original_max_position_embeddings"] = (
            config.rope_scaling.original_max_position_embeddings
        )
    if config.family == "gemma3":
        result.update(_gemma3_fields(config, rope))
    return result


def _gemma3_fields(config: ModelConfig, rope: dict[str, Any]) -> dict[str, Any]:
    """Gemma 3's own keys: layer types and window, a RoPE per layer type, the query scale,
    the activation and the logits' cap (the inverse of ``hf_fields._gemma3``)."""
    sliding = config.sliding_layers or (0,) * config.num_layers
    local = {"rope_type": "default", "rope_theta": config.rope_local_theta or config.rope_theta}
    return {
        "hidden_act": "gelu_pytorch_tanh",
        "hidden_activation": "gelu_pytorch_tanh",
        "layer_types": [
            "sliding_attention" if sliding[index] else "full_attention"
            for index in range(config.num_layers)
        ],
        "sliding_window": config.sliding_window,
        "rope_parameters": {"full_attention": rope, "sliding_attention": local},
        # An integer in transformers' config class (it checks the type).
        "query_pre_attn_scalar": _integral(config.query_pre_attn_scalar or config.head_dim),
        "final_logit_softcapping": config.final_logit_softcapping,
        "attn_logit_softcapping": None,
    }


def _integral(value: float) -> float | int:
    return int(value) if float(value).is_integer() else value


def _safetensors_files(folder: Path) -> list[Path]:
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise WeightsError(f"{folder}: no *.safetensors files")
    return files


def expected_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor name the decoder needs, with its shape (Hugging Face names)."""
    return family_for(config).shapes(config)


def load_checkpoint(
    folder: Path | str, dtype: Any = None, layers: int | None = None
) -> tuple[ModelConfig, dict[str, Any]]:
    """The config and the tensors (``torch``, in ``dtype``, fp16 by default) of a folder.

    ``layers`` keeps only the first N decoder layers (a quick build of a big checkpoint).
    """
    import torch
    from safetensors import safe_open

    folder = Path(folder)
    raw = _read_config(folder)
    config = model_config_from_hf(raw, name=_model_name(folder, raw))
    if layers is not None:
        if layers > config.num_layers:
            raise WeightsError(f"layers={layers} but the checkpoint has {config.num_layers}")
        config = config.model_copy(update={"num_layers": layers})
    target = dtype or torch.float16
    expected = expected_shapes(config)
    tensors: dict[str, Any] = {}
    for path in _safetensors_files(folder):
        with safe_open(str(path), framework="pt") as archive:
            for name in archive.keys():  # noqa: SIM118 (safe_open is no mapping)
                if name in expected:
                    tensor = archive.get_tensor(name)
                    if tuple(tensor.shape) != expected[name]:
                        raise WeightsError(
                            f"{path.name}: {name} has shape {tuple(tensor.shape)}, "
                            f"expected {expected[name]}"
                        )
                    tensors[name] = _convert(name, tensor, target)
                elif is_unused_tensor(name) or _beyond_layers(name, config.num_layers, layers):
                    continue
                elif name == "lm_head.weight" and config.tie_word_embeddings:
                    continue  # some exporters write the tied copy out as well
                else:
                    raise WeightsError(f"{path.name}: unexpected tensor {name}")
    missing = [name for name in expected if name not in tensors]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise WeightsError(f"{folder}: tensor {missing[0]} is missing{more}")
    return config, family_for(config).decoder_tensors(config, tensors)


def _beyond_layers(name: str, num_layers: int, layers: int | None) -> bool:
    match = re.match(r"model\.layers\.(\d+)\.", name)
    return layers is not None and match is not None and int(match.group(1)) >= num_layers


def _convert(name: str, tensor: Any, dtype: Any) -> Any:
    import torch

    if not tensor.is_floating_point():
        raise WeightsError(f"{name}: dtype {tensor.dtype} is not a floating point type")
    converted = tensor.to(dtype)
    if dtype == torch.float16 and not torch.isfinite(converted).all():
        raise WeightsError(f"{name}: values overflow fp16")
    return converted


def _model_name(folder: Path, config: dict[str, Any]) -> str:
    source = str(config.get("_name_or_path") or folder.resolve().name)
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", source.rstrip("/").split("/")[-1]).strip("-")
    return name[:64] or "weights"


def fingerprint(folder: Path | str, memo_path: Path | None = None) -> str:
    """sha256 over config.json and every safetensors file (their bytes, in name order).

    Hashing gigabytes takes seconds, so digests are remembered in ``memo_path`` by each file's
    (size, mtime, inode): an unchanged folder is fingerprinted from its stat alone.
    """
    folder = Path(folder).resolve()
    files = [folder / "config.json", *_safetensors_files(folder)]
    memo: dict[str, str] = {}
    if memo_path is not None and memo_path.is_file():
        try:
            memo = json.loads(memo_path.read_text())
        except ValueError:
            memo = {}
    digest = hashlib.sha256()
    changed = False
    for path in files:
        stat = path.stat()
        stamp = f"{path}|{stat.st_size}|{stat.st_mtime_ns}|{stat.st_ino}"
        file_digest = memo.get(stamp)
        if file_digest is None:
            file_hash = hashlib.sha256()
            with path.open("rb") as stream:
                while chunk := stream.read(_HASH_CHUNK):
                    file_hash.update(chunk)
            file_digest = memo[stamp] = file_hash.hexdigest()
            changed = True
        digest.update(f"{path.name}:{file_digest}\n".encode())
    if changed and memo_path is not None:
        memo_path.parent.mkdir(parents=True, exist_ok=True)
        partial = memo_path.with_name(memo_path.name + f".{os.getpid()}.partial")
        partial.write_text(json.dumps(memo))
        os.replace(partial, memo_path)
    return digest.hexdigest()
