"""doctor_jobs: an uploaded package diagnosed, repaired, proven and measured in one job

Each job belongs to its project; a worker holds it under a lease (renewed with its progress), so
a killed worker's job is run again once the lease has run out. Done, it holds the report
(JSONB), the repaired package's artifact, the model it is registered as and its A/B sweep.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-03 12:10:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "doctor_jobs",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("project_id", sa.Integer(), sa.ForeignKey("projects.id"), nullable=False),
        sa.Column("submitted_by", sa.String(128), nullable=False),
        sa.Column("package", sa.String(48), nullable=False),
        sa.Column("package_sha256", sa.String(64), nullable=False),
        sa.Column("tokenizer", sa.String(64), nullable=False),
        sa.Column("prompts", sa.Integer(), nullable=False),
        sa.Column("steps", sa.Integer(), nullable=False),
        sa.Column("devices", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("stage", sa.String(200), nullable=True),
        sa.Column("progress", sa.Float(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("worker", sa.String(255), nullable=True),
        sa.Column("lease_token", sa.String(64), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("report", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("artifact_sha256", sa.String(64), nullable=True),
        sa.Column("repaired_model_id", sa.Integer(), sa.ForeignKey("models.id"), nullable=True),
        sa.Column("sweep_id", sa.Integer(), sa.ForeignKey("sweeps.id"), nullable=True),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_index("ix_doctor_jobs_project_id", "doctor_jobs", ["project_id"])
    op.create_index("ix_doctor_jobs_state_lease", "doctor_jobs", ["state", "lease_expires_at"])


def downgrade() -> None:
    op.drop_index("ix_doctor_jobs_state_lease", table_name="doctor_jobs")
    op.drop_index("ix_doctor_jobs_project_id", table_name="doctor_jobs")
    op.drop_table("doctor_jobs")
