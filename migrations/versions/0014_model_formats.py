"""models.format: an uploaded package names its model format

A package built elsewhere was kind ``mlpackage``; it is now kind ``package`` with a format, and
every stored package is a Core ML one (``coreml``). Checkpoints (``hf``, ``gguf``) have none.
Build keys do not hash the kind, so no key changes.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-06 13:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("models", sa.Column("format", sa.String(16), nullable=True))
    op.execute("UPDATE models SET kind = 'package', format = 'coreml' WHERE kind = 'mlpackage'")


def downgrade() -> None:
    op.execute("UPDATE models SET kind = 'mlpackage' WHERE kind = 'package'")
    op.drop_column("models", "format")
