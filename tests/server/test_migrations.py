"""Every schema change is a migration: upgrade and downgrade on a scratch database."""

from __future__ import annotations

from alembic import command
from alembic.config import Config
from sqlalchemy import create_engine, inspect

from tests.support.paths import ROOT
from tests.support.services import TEST_DATABASE, recreate_database

SCRATCH = f"{TEST_DATABASE}_migrations"  # apart from any other test run's scratch
URL = f"postgresql+psycopg://postgres@127.0.0.1:5432/{SCRATCH}"


def tables() -> set[str]:
    engine = create_engine(URL)
    try:
        return set(inspect(engine).get_table_names()) - {"alembic_version"}
    finally:
        engine.dispose()


def test_upgrade_matches_models_and_downgrade_removes_everything() -> None:
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from server.models import Base

    recreate_database(SCRATCH)
    config = Config(str(ROOT / "alembic.ini"))
    config.set_main_option("sqlalchemy.url", URL)
    command.upgrade(config, "head")
    assert tables() == set(Base.metadata.tables)
    engine = create_engine(URL)
    with engine.connect() as connection:
        differences = compare_metadata(MigrationContext.configure(connection), Base.metadata)
    engine.dispose()
    assert differences == []
    command.downgrade(config, "base")
    assert tables() == set()
    command.upgrade(config, "head")
    assert tables() == set(Base.metadata.tables)
