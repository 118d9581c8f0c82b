"""server-side UI sessions and rate-limited sign-in

The UI cookie carries a random session id (its hash stored here) instead of the API token;
refused sign-ins are counted per client address.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01 04:20:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "ui_sessions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("session_sha256", sa.String(length=64), nullable=False),
        sa.Column("token_id", sa.Integer(), nullable=False),
        sa.Column("csrf_token", sa.String(length=64), nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["token_id"], ["api_tokens.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("session_sha256"),
    )
    op.create_index("ix_ui_sessions_token_id", "ui_sessions", ["token_id"])
    op.create_table(
        "sign_in_failures",
        sa.Column("id", sa.BigInteger(), nullable=False),
        sa.Column("client", sa.String(length=64), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_sign_in_failures_client_at", "sign_in_failures", ["client", "at"])


def downgrade() -> None:
    op.drop_index("ix_sign_in_failures_client_at", table_name="sign_in_failures")
    op.drop_table("sign_in_failures")
    op.drop_index("ix_ui_sessions_token_id", table_name="ui_sessions")
    op.drop_table("ui_sessions")
