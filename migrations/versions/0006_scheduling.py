"""scheduling: idempotent claim keys, sweep priorities, a wake-up for idle agents

A claim carries a key its agent generated: the same key from the same device gets the same run
back, so a claim whose answer was lost is never orphaned. A sweep has a priority (ci, nightly,
adhoc) that weighs its share of the devices. Every run that becomes claimable notifies the
channel `decodebench_runs` (delivered on commit), which wakes the server
processes' long-poll claims. The payload is `<device class> <run id>`: one notification per
run (PostgreSQL folds identical ones within a transaction), so a process wakes one waiting
device per claimable run rather than every idle device of the class.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01 08:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("claim_key", sa.String(length=64), nullable=True))
    op.add_column(
        "sweeps",
        sa.Column("priority", sa.String(length=16), server_default="adhoc", nullable=False),
    )
    # The claim's reads: a sweep's queued runs in claim order, its running count and last start
    # per class, a device's running run, expired leases. Each is an index range, not a scan.
    op.create_index(
        "ix_runs_claim_order",
        "runs",
        ["sweep_id", "device_class", "state", "attempts", "order_key", "id"],
    )
    op.create_index(
        "ix_runs_sweep_class_started", "runs", ["sweep_id", "device_class", "started_at"]
    )
    op.create_index("ix_runs_device_state", "runs", ["device_udid", "state"])
    op.create_index("ix_runs_state_lease", "runs", ["state", "lease_expires_at"])
    op.execute(
        """
        CREATE FUNCTION decodebench_notify_claimable() RETURNS trigger AS $$
        BEGIN
            PERFORM pg_notify('decodebench_runs', NEW.device_class || ' ' || NEW.id);
            RETURN NULL;
        END;
        $$ LANGUAGE plpgsql
        """
    )
    op.execute(
        """
        CREATE TRIGGER runs_claimable AFTER INSERT OR UPDATE OF state ON runs
        FOR EACH ROW WHEN (NEW.state = 'queued')
        EXECUTE FUNCTION decodebench_notify_claimable()
        """
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER runs_claimable ON runs")
    op.execute("DROP FUNCTION decodebench_notify_claimable()")
    for index in (
        "ix_runs_state_lease",
        "ix_runs_device_state",
        "ix_runs_sweep_class_started",
        "ix_runs_claim_order",
    ):
        op.drop_index(index, table_name="runs")
    op.drop_column("sweeps", "priority")
    op.drop_column("runs", "claim_key")
