"""nightly schedules: firings (exactly once per due time), alerts, webhook deliveries

Revision ID: 0005
Revises: 0003
Create Date: 2026-12-01 05:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = postgresql.JSONB(astext_type=sa.Text())


def _now() -> sa.Column:
    return sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False)


def upgrade() -> None:
    op.create_table(
        "schedules",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("name", sa.String(length=64), nullable=False, unique=True),
        sa.Column("spec", JSON, nullable=False),
        sa.Column("cron", sa.String(length=128), nullable=False),
        sa.Column("timezone", sa.String(length=64), nullable=False),
        sa.Column("min_effect", sa.Float(), nullable=False),
        sa.Column("owner", sa.String(length=128), nullable=False),
        sa.Column("enabled", sa.Boolean(), nullable=False),
        sa.Column("webhook_url", sa.Text(), nullable=True),
        sa.Column("webhook_secret", sa.String(length=256), nullable=True),
        _now(),
    )
    op.create_table(
        "schedule_firings",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("schedule_id", sa.Integer(), sa.ForeignKey("schedules.id", ondelete="CASCADE"), nullable=False),
        sa.Column("due_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("trigger", sa.String(length=16), nullable=False),
        sa.Column("sweep_id", sa.Integer(), sa.ForeignKey("sweeps.id", ondelete="SET NULL"), nullable=True),
        _now(),
        sa.Column("completed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("context", JSON, nullable=True),
        sa.Column("values", JSON, nullable=True),
        sa.UniqueConstraint("schedule_id", "due_at"),
    )
    op.create_table(
        "alerts",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("schedule_id", sa.Integer(), sa.ForeignKey("schedules.id", ondelete="CASCADE"), nullable=False),
        sa.Column("variant", sa.String(length=64), nullable=False),
        sa.Column("device_class", sa.String(length=64), nullable=False),
        sa.Column("direction", sa.String(length=16), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("last_good_firing_id", sa.Integer(), sa.ForeignKey("schedule_firings.id"), nullable=False),
        sa.Column("first_bad_firing_id", sa.Integer(), sa.ForeignKey("schedule_firings.id"), nullable=False),
        sa.Column("last_good_sweep_id", sa.Integer(), nullable=True),
        sa.Column("first_bad_sweep_id", sa.Integer(), nullable=True),
        sa.Column("confirmation_sweep_id", sa.Integer(), nullable=True),
        sa.Column("suspect", JSON, nullable=False),
        sa.Column("confirmation", JSON, nullable=True),
        sa.Column("ratio", JSON, nullable=True),
        sa.Column("changed", JSON, nullable=True),
        sa.Column("build_diff", sa.Text(), nullable=True),
        _now(),
        sa.Column("decided_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_index("ix_alerts_schedule", "alerts", ["schedule_id", "created_at"])
    op.create_table(
        "webhook_deliveries",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("schedule_id", sa.Integer(), sa.ForeignKey("schedules.id", ondelete="CASCADE"), nullable=False),
        sa.Column("event", sa.String(length=32), nullable=False),
        sa.Column("payload", JSON, nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        _now(),
    )
    op.create_index("ix_webhook_deliveries_due", "webhook_deliveries", ["state", "next_attempt_at"])
    op.create_table(
        "webhook_attempts",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("delivery_id", sa.Integer(), sa.ForeignKey("webhook_deliveries.id", ondelete="CASCADE"), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("status_code", sa.Integer(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
    )
    op.create_index("ix_webhook_attempts_delivery_id", "webhook_attempts", ["delivery_id"])


def downgrade() -> None:
    op.drop_table("webhook_attempts")
    op.drop_table("webhook_deliveries")
    op.drop_table("alerts")
    op.drop_table("schedule_firings")
    op.drop_table("schedules")
