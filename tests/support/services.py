"""The test PostgreSQL database and Redis database, and reading them back.

Importing this module points the server's settings at the test services: tests/conftest.py
imports it before anything imports the server."""

from __future__ import annotations

import os

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

ALEMBIC_VERSION_TABLE = "alembic_version"


def recreate_database(name: str) -> None:
    import psycopg

    with psycopg.connect(ADMIN_URL, autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        connection.execute(f'CREATE DATABASE "{name}"')


def truncated_tables() -> list[str]:
    """Every table the models declare, children before parents (all but Alembic's own): what each
    test starts without, so a new table is emptied without anyone listing it."""
    from server.models import Base

    return [
        table.name
        for table in reversed(Base.metadata.sorted_tables)
        if table.name != ALEMBIC_VERSION_TABLE
    ]


def query(sql: str, **params) -> list:
    """Rows of ``sql`` on the test database, as tuples (nothing for a statement without rows)."""
    from sqlalchemy import text

    from server.db import get_engine

    with get_engine().begin() as connection:
        result = connection.execute(text(sql), params)
        return [tuple(row) for row in result] if result.returns_rows else []


def table_counts() -> dict[str, int]:
    """The number of rows in each of the tables the tests truncate."""
    from sqlalchemy import text

    from server.db import get_engine

    with get_engine().connect() as connection:
        return {
            table: connection.execute(text(f"SELECT count(*) FROM {table}")).scalar_one()
            for table in truncated_tables()
        }
