"""profile calibrations: least-squares fits of each device class's profile

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29 14:10:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "profile_calibrations",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("device_class", sa.String(length=64), nullable=False),
        sa.Column("effective_bandwidth_mb_s", sa.Float(), nullable=False),
        sa.Column("dispatch_overhead_us", sa.Float(), nullable=False),
        sa.Column(
            "calibrated_parameters", postgresql.JSONB(astext_type=sa.Text()), nullable=False
        ),
        sa.Column("runs", sa.Integer(), nullable=False),
        sa.Column("builds", sa.Integer(), nullable=False),
        sa.Column("includes_simulated", sa.Boolean(), nullable=False),
        sa.Column("rms_relative_error", sa.Float(), nullable=False),
        sa.Column("note", sa.Text(), nullable=False),
        sa.Column("points", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("requested_by", sa.String(length=128), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(
        "ix_profile_calibrations_device_class",
        "profile_calibrations",
        ["device_class", "created_at"],
    )


def downgrade() -> None:
    op.drop_index("ix_profile_calibrations_device_class", table_name="profile_calibrations")
    op.drop_table("profile_calibrations")
