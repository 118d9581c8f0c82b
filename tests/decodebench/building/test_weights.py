"""Real checkpoints: Hugging Face folders load into the decoder, or fail naming the key."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from decodebench.building.weights import (
    WeightsError,
    fingerprint,
    hf_config_dict,
    load_checkpoint,
    model_config_from_hf,
)
from decodebench.contracts.presets import TINY_EXAONE, TINY_LLAMA, TINY_QWEN, ModelConfig
from decodebench.modeling import build_model, greedy_decode

transformers = pytest.importorskip("transformers")

CONTEXT = 64
PROMPT = [5, 9, 200, 31]


def write_folder(folder: Path, config: dict, tensors: dict[str, torch.Tensor]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    save_file(
        {name: tensor.contiguous() for name, tensor in tensors.items()},
        folder / "model.safetensors",
    )
    return folder


@pytest.fixture(scope="module", params=[TINY_LLAMA, TINY_QWEN, TINY_EXAONE], ids=lambda c: c.name)
def saved(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """A checkpoint written by transformers itself (save_pretrained), and that reference model."""
    config: ModelConfig = request.param
    fields = hf_config_dict(config, max_position_embeddings=CONTEXT)
    hf_config = transformers.AutoConfig.for_model(fields.pop("model_type"), **fields)
    torch.manual_seed(3)
    reference = transformers.AutoModelForCausalLM.from_config(hf_config).eval()
    folder = tmp_path_factory.mktemp(config.name)
    reference.save_pretrained(folder)
    return config, folder, reference


def test_checkpoint_loads_and_matches_the_reference(saved) -> None:
    config, folder, reference = saved
    loaded_config, tensors = load_checkpoint(folder, dtype=torch.float32)
    assert loaded_config.model_copy(update={"name": config.name}) == config
    model = build_model(loaded_config, CONTEXT, weights=tensors)
    tokens, logits = greedy_decode(model, PROMPT, 8)
    with torch.no_grad():
        expected = reference(torch.tensor([PROMPT + tokens[:-1]])).logits[0]
    torch.testing.assert_close(torch.stack(logits), expected, rtol=1e-4, atol=1e-4)


def test_fp16_load_and_layer_subset(saved) -> None:
    config, folder, _ = saved
    loaded_config, tensors = load_checkpoint(folder, layers=1)
    assert loaded_config.num_layers == 1
    assert all(tensor.dtype == torch.float16 for tensor in tensors.values())
    assert not any(name.startswith("model.layers.1.") for name in tensors)


def _tiny_llama_tensors() -> tuple[dict, dict[str, torch.Tensor]]:
    model = build_model(TINY_LLAMA, CONTEXT)
    return hf_config_dict(TINY_LLAMA), {k: v.clone() for k, v in model.state_dict().items()}


def test_unsupported_architecture_is_named(tmp_path: Path) -> None:
    config, tensors = _tiny_llama_tensors()
    config["architectures"] = ["GPT2LMHeadModel"]
    folder = write_folder(tmp_path / "gpt2", config, tensors)
    with pytest.raises(WeightsError, match=r"architectures \['GPT2LMHeadModel'\] not supported"):
        load_checkpoint(folder)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("hidden_act", "gelu", "config.json: hidden_act='gelu' is not supported"),
        ("attention_bias", True, "config.json: attention_bias=True"),
        ("num_hidden_layers", None, "config.json: num_hidden_layers is missing"),
        (
            "rope_parameters",
            {"rope_type": "yarn", "factor": 2.0},
            "rope_parameters.rope_type='yarn'",
        ),
    ],
)
def test_unsupported_config_keys_are_named(key: str, value: object, message: str) -> None:
    config = hf_config_dict(TINY_LLAMA)
    if value is None:
        del config[key]
    else:
        config[key] = value
    with pytest.raises(WeightsError, match=message.replace("[", r"\[")):
        model_config_from_hf(config, "x")


def test_exaone_hybrid_attention_is_refused() -> None:
    config = hf_config_dict(TINY_EXAONE)
    config["sliding_window"] = 4
    config["layer_types"] = ["sliding_attention", "full_attention"]
    with pytest.raises(WeightsError, match="config.json: sliding_window"):
        model_config_from_hf(config, "x")


def test_missing_wrong_and_unexpected_tensors_are_named(tmp_path: Path) -> None:
    config, tensors = _tiny_llama_tensors()
    missing = dict(tensors)
    del missing["model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(
        WeightsError, match=r"tensor model\.layers\.1\.mlp\.up_proj\.weight is missing"
    ):
        load_checkpoint(write_folder(tmp_path / "missing", config, missing))

    wrong = dict(tensors)
    wrong["model.layers.0.self_attn.k_proj.weight"] = torch.zeros(3, 3)
    with pytest.raises(
        WeightsError, match=r"k_proj\.weight has shape \(3, 3\), expected \(32, 128\)"
    ):
        load_checkpoint(write_folder(tmp_path / "wrong", config, wrong))

    extra = dict(tensors)
    extra["model.layers.0.self_attn.q_proj.bias"] = torch.zeros(128)
    with pytest.raises(
        WeightsError, match=r"unexpected tensor model\.layers\.0\.self_attn\.q_proj\.bias"
    ):
        load_checkpoint(write_folder(tmp_path / "extra", config, extra))

    overflow = dict(tensors)
    overflow["model.norm.weight"] = torch.full((128,), 1e6)
    with pytest.raises(WeightsError, match=r"model\.norm\.weight: values overflow fp16"):
        load_checkpoint(write_folder(tmp_path / "overflow", config, overflow))


def test_fingerprint_follows_content_and_remembers(tmp_path: Path) -> None:
    config, tensors = _tiny_llama_tensors()
    folder = write_folder(tmp_path / "ckpt", config, tensors)
    memo = tmp_path / "memo.json"
    first = fingerprint(folder, memo)
    assert memo.is_file() and fingerprint(folder, memo) == first
    tensors["model.norm.weight"] = tensors["model.norm.weight"] + 1
    write_folder(folder, config, tensors)
    assert fingerprint(folder, memo) != first


def _longrope_phi() -> ModelConfig:
    """Phi-4-mini with LongRoPE factors (the preset leaves them out): 48 of each for its 96
    rotated dimensions, the attention factor as transformers derives it."""
    from decodebench.contracts.presets import PHI_4_MINI, LongRopeScaling

    pairs = PHI_4_MINI.rotary_dim // 2
    original, longest = 4096, 131072
    return PHI_4_MINI.model_copy(
        update={
            "name": "phi-4-mini-longrope",
            "rope_scaling": LongRopeScaling(
                short_factor=tuple(1.0 + index / 100 for index in range(pairs)),
                long_factor=tuple(1.0 + index for index in range(pairs)),
                original_max_position_embeddings=original,
                attention_factor=(1 + math.log(longest / original) / math.log(original)) ** 0.5,
            ),
        }
    )


def _capped_gemma() -> ModelConfig:
    from decodebench.contracts.presets import GEMMA_3_270M

    return GEMMA_3_270M.model_copy(update={"name": "gemma-capped", "final_logit_softcapping": 30.0})


def _round_trip_configs() -> list[ModelConfig]:
    from decodebench.contracts.presets import PRESETS

    return [*PRESETS.values(), _longrope_phi(), _capped_gemma()]


@pytest.mark.parametrize("config", _round_trip_configs(), ids=lambda config: config.name)
def test_a_config_round_trips_through_transformers_config_class(config: ModelConfig) -> None:
    """hf_config_dict gives transformers' own config class every field the decoder reads: its
    to_dict() reads back as the same ModelConfig."""
    fields = hf_config_dict(config, max_position_embeddings=131072)
    hf_config = transformers.AutoConfig.for_model(fields.pop("model_type"), **fields)
    assert model_config_from_hf(hf_config.to_dict(), config.name) == config


def test_longrope_fields_reach_transformers_rope() -> None:
    """The short and long factors and the original context are what transformers' LongRoPE
    initialisation reads, and it derives the attention factor we carry."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = _longrope_phi()
    scaling = config.rope_scaling
    assert scaling is not None and scaling.rope_type == "longrope"
    fields = hf_config_dict(config, max_position_embeddings=131072)
    hf_config = transformers.AutoConfig.for_model(fields.pop("model_type"), **fields)
    rope = hf_config.rope_parameters
    assert tuple(rope["short_factor"]) == scaling.short_factor
    assert tuple(rope["long_factor"]) == scaling.long_factor
    assert hf_config.original_max_position_embeddings == scaling.original_max_position_embeddings
    _, attention_factor = ROPE_INIT_FUNCTIONS["longrope"](hf_config, "cpu")
    assert attention_factor == pytest.approx(scaling.attention_factor, rel=1e-12)


def test_gemma_fields_reach_transformers_config() -> None:
    from decodebench.contracts.presets import GEMMA_3_1B

    fields = hf_config_dict(GEMMA_3_1B)
    hf_config = transformers.AutoConfig.for_model(fields.pop("model_type"), **fields)
    assert type(hf_config).__name__ == "Gemma3TextConfig"
    sliding = [kind == "sliding_attention" for kind in hf_config.layer_types]
    assert tuple(map(int, sliding)) == GEMMA_3_1B.sliding_layers
    assert hf_config.sliding_window == GEMMA_3_1B.sliding_window
    assert hf_config.rope_parameters["sliding_attention"]["rope_theta"] == (
        GEMMA_3_1B.rope_local_theta
    )
    assert hf_config.rope_parameters["full_attention"]["rope_theta"] == GEMMA_3_1B.rope_theta
    assert hf_config.query_pre_attn_scalar == GEMMA_3_1B.query_pre_attn_scalar
    assert hf_config.hidden_activation == "gelu_pytorch_tanh"
