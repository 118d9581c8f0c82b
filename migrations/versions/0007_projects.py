"""projects own sweeps, schedules and calibrations; user tokens belong to one; devices may be pinned

The "default" project is created and every existing user token, sweep, schedule and calibration
is assigned to it, so an existing setup keeps seeing everything it saw.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01 08:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# (table, nullable): user tokens and devices may have none (agent/worker tokens, shared devices).
OWNED = (
    ("api_tokens", True),
    ("sweeps", False),
    ("schedules", False),
    ("profile_calibrations", False),
    ("devices", True),
)


def upgrade() -> None:
    op.create_table(
        "projects",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("name", sa.String(length=64), nullable=False, unique=True),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
    )
    op.execute("INSERT INTO projects (name) VALUES ('default')")
    default = "(SELECT id FROM projects WHERE name = 'default')"
    for table, nullable in OWNED:
        op.add_column(table, sa.Column("project_id", sa.Integer(), nullable=True))
        op.create_foreign_key(f"{table}_project_id_fkey", table, "projects", ["project_id"], ["id"])
        op.create_index(f"ix_{table}_project_id", table, ["project_id"])
        if table == "api_tokens":
            op.execute(f"UPDATE api_tokens SET project_id = {default} WHERE kind = 'user'")
        elif not nullable:
            op.execute(f"UPDATE {table} SET project_id = {default}")
            op.alter_column(table, "project_id", nullable=False)
    # A schedule's name is unique within its project (another project's names are not revealed).
    op.drop_constraint("schedules_name_key", "schedules", type_="unique")
    op.create_unique_constraint(
        "schedules_project_id_name_key", "schedules", ["project_id", "name"]
    )


def downgrade() -> None:
    op.drop_constraint("schedules_project_id_name_key", "schedules", type_="unique")
    op.create_unique_constraint("schedules_name_key", "schedules", ["name"])
    for table, _ in reversed(OWNED):
        op.drop_index(f"ix_{table}_project_id", table_name=table)
        op.drop_constraint(f"{table}_project_id_fkey", table, type_="foreignkey")
        op.drop_column(table, "project_id")
    op.drop_table("projects")
