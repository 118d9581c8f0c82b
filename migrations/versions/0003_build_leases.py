"""build leases, token scopes, devices' failed checks

A worker builds only under a lease it renews; an expired one is rebuilt. User tokens carry
scopes (read, submit, admin).

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01 04:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("builds", sa.Column("lease_token", sa.String(length=64), nullable=True))
    op.add_column(
        "builds", sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True)
    )
    op.create_index("ix_builds_state_lease", "builds", ["state", "lease_expires_at"])
    op.add_column(
        "api_tokens",
        sa.Column(
            "scopes",
            postgresql.JSONB(astext_type=sa.Text()),
            nullable=False,
            server_default=sa.text("'[\"read\", \"submit\"]'::jsonb"),
        ),
    )


    op.add_column(
        "devices",
        sa.Column(
            "failed_checks",
            postgresql.JSONB(astext_type=sa.Text()),
            nullable=False,
            server_default=sa.text("'[]'::jsonb"),
        ),
    )


def downgrade() -> None:
    op.drop_column("devices", "failed_checks")
    op.drop_column("api_tokens", "scopes")
    op.drop_index("ix_builds_state_lease", table_name="builds")
    op.drop_column("builds", "lease_expires_at")
    op.drop_column("builds", "lease_token")
