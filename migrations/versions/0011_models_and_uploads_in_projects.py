"""models users bring and their uploads belong to a project

Existing models and uploads go to the "default" project. A model's name stays unique across
the server (a build worker fetches a model by the name its sweep gives); what another project
brought is not shown, listed, used in a sweep nor downloadable.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01 12:40:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLES = ("models", "uploads")


def upgrade() -> None:
    default = "(SELECT id FROM projects WHERE name = 'default')"
    for table in TABLES:
        op.add_column(table, sa.Column("project_id", sa.Integer(), nullable=True))
        op.create_foreign_key(f"{table}_project_id_fkey", table, "projects", ["project_id"], ["id"])
        op.create_index(f"ix_{table}_project_id", table, ["project_id"])
        op.execute(f"UPDATE {table} SET project_id = {default}")
        op.alter_column(table, "project_id", nullable=False)


def downgrade() -> None:
    for table in TABLES:
        op.drop_index(f"ix_{table}_project_id", table_name=table)
        op.drop_constraint(f"{table}_project_id_fkey", table, type_="foreignkey")
        op.drop_column(table, "project_id")
