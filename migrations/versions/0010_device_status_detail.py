"""device status as a fixed set of reasons, its particulars apart

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01 09:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# What agents reported as one string before: "<status>: <particulars>".
PREFIXED = ("cooling", "low battery", "unreachable")


def upgrade() -> None:
    op.add_column(
        "devices",
        sa.Column("status_detail", sa.String(200), nullable=False, server_default=""),
    )
    for status in PREFIXED:
        op.execute(
            sa.text(
                "UPDATE devices SET status_detail = left(substr(status, :cut), 200), "
                "status = :status WHERE status LIKE :prefix"
            ).bindparams(status=status, cut=len(status) + 3, prefix=f"{status}: %")
        )


def downgrade() -> None:
    op.execute(
        "UPDATE devices SET status = left(status || ': ' || status_detail, 64) "
        "WHERE status_detail <> ''"
    )
    op.drop_column("devices", "status_detail")
