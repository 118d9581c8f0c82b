"""GGUF files of transformers checkpoints, laid out as llama.cpp's converter lays them out:
tensor names from the gguf package's own name map, Gemma's norms stored as ``1 + w``, fused
Phi-3 projections kept fused, fp32 data (file type 0), and a small sentencepiece-style
vocabulary. What transformers' GGUF loader reads back."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


def _vocabulary(size: int) -> list[str]:
    letters = [chr(ord("a") + index) for index in range(26)]
    tokens = ["<unk>", "<s>", "</s>", *letters, *(f"\u2581{letter}" for letter in letters)]
    tokens += [f"\u2581t{index}" for index in range(size - len(tokens))]
    return tokens[:size]


def write_gguf(model: Any, path: Path, architecture: str) -> Path:
    """``model`` (a transformers causal LM of ``architecture``: qwen3, phi3 or gemma3) as a
    GGUF file at ``path``."""
    import gguf

    config = model.config
    arch = {"qwen3": gguf.MODEL_ARCH.QWEN3, "phi3": gguf.MODEL_ARCH.PHI3}.get(
        architecture, gguf.MODEL_ARCH.GEMMA3
    )
    names = gguf.get_tensor_name_map(arch, config.num_hidden_layers)
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_name(path.stem)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    rope = getattr(config, "rope_parameters", None) or {}
    rope = rope.get("full_attention", rope)
    writer.add_rope_freq_base(float(rope.get("rope_theta", 10_000.0)))
    rotary = int(head_dim * float(rope.get("partial_rotary_factor", 1.0)))
    writer.add_rope_dimension_count(rotary)
    if architecture == "gemma3":
        writer.add_sliding_window(config.sliding_window)
    writer.add_vocab_size(config.vocab_size)
    writer.add_file_type(0)
    tokens = _vocabulary(config.vocab_size)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([-float(index) for index in range(len(tokens))])
    writer.add_token_types([2, 3, 3] + [1] * (len(tokens) - 3))
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_pad_token_id(0)
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        target = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if target is None:
            raise KeyError(f"the gguf name map has no tensor for {name}")
        values = tensor.detach().float().numpy()
        if architecture == "gemma3" and name.endswith("norm.weight"):
            values = values + 1  # llama.cpp stores Gemma's RMSNorm gain as 1 + w
        writer.add_tensor(target, np.ascontiguousarray(values, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
