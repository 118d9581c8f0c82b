"""device_spreads, schedules.budget, schedule_firings.adaptive: detection adapts to the spread

Each device class's run-to-run and night-to-night spread, learned per project from its stored
repeated runs; a schedule's budget of runs per night and series; per firing, each series' runs
and what the adaptive nightly decided (more runs, decided, budget spent).

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-03 09:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "device_spreads",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("project_id", sa.Integer(), sa.ForeignKey("projects.id"), nullable=False),
        sa.Column("device_class", sa.String(64), nullable=False),
        sa.Column("run_spread", sa.Float(), nullable=False),
        sa.Column("night_spread", sa.Float(), nullable=False),
        sa.Column("runs", sa.Integer(), nullable=False),
        sa.Column("nights", sa.Integer(), nullable=False),
        sa.Column(
            "learned_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.UniqueConstraint("project_id", "device_class"),
    )
    op.create_index("ix_device_spreads_project_id", "device_spreads", ["project_id"])
    op.add_column(
        "schedules", sa.Column("budget", sa.Integer(), server_default="24", nullable=False)
    )
    op.add_column(
        "schedule_firings",
        sa.Column("adaptive", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    )


def downgrade() -> None:
    op.drop_column("schedule_firings", "adaptive")
    op.drop_column("schedules", "budget")
    op.drop_index("ix_device_spreads_project_id", table_name="device_spreads")
    op.drop_table("device_spreads")
