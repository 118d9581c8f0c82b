"""sweeps.verdict_cache: a finished sweep's verdicts, computed once and shared by every process

The bootstrap verdicts of a sweep whose runs are all final are stored with the ids of the
succeeded runs they were computed from; a retried run empties the cache.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01 08:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "sweeps",
        sa.Column("verdict_cache", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    )


def downgrade() -> None:
    op.drop_column("sweeps", "verdict_cache")
