"""Which queued run a free device takes next: weighted fair share between sweeps, with aging.

Every active sweep with a queued run of the device's class is ranked by

    (its runs of that class now running + 1) / effective weight,
    effective weight = priority weight × (1 + seconds since it last got a device / aging),

lowest first; ties go to the sweep served longest ago, then the oldest. So

- two sweeps of one priority share the class's devices about evenly (a second sweep does not
  wait behind the first one's 400 runs), and on a single device they alternate;
- a CI sweep (weight 4) takes about twice a nightly one's devices (2) and four times an ad hoc
  one's (1), and a CI sweep queued behind a nightly one takes the next free device;
- no sweep starves: one that gets no device sees its weight grow with the time it has waited
  (at the default 300 s aging, an ad hoc sweep waiting 15 minutes weighs as much as a CI one).

Only the runs' rows are read, through indexes (ix_runs_claim_order, ix_runs_sweep_class_started); the run taken is locked with SKIP LOCKED and nothing else is, so concurrent claims
never queue on a shared row.
"""

from __future__ import annotations

from sqlalchemy import select, text
from sqlalchemy.orm import Session

from decodebench.contracts.names import SweepPriority
from server.models import Run, RunState

PRIORITY_WEIGHTS = {SweepPriority.ci: 4.0, SweepPriority.nightly: 2.0, SweepPriority.adhoc: 1.0}

_RANKED_SWEEPS = text(
    """
    SELECT s.id
    FROM sweeps AS s
    CROSS JOIN LATERAL (
        SELECT count(*) AS running FROM runs AS r
        WHERE r.sweep_id = s.id AND r.device_class = :device_class AND r.state = 'running'
    ) AS busy
    CROSS JOIN LATERAL (
        SELECT max(r.started_at) AS last_started FROM runs AS r
        WHERE r.sweep_id = s.id AND r.device_class = :device_class
    ) AS served
    CROSS JOIN LATERAL (
        SELECT CASE s.priority WHEN 'ci' THEN :ci WHEN 'nightly' THEN :nightly ELSE :adhoc END
            * (1 + greatest(0, extract(epoch FROM clock_timestamp()
                                       - coalesce(served.last_started, s.created_at)))
                   / :aging_s) AS weight
    ) AS share
    WHERE s.state IN ('building', 'running')
      AND (CAST(:project_id AS integer) IS NULL OR s.project_id = :project_id)
      AND EXISTS (
        SELECT 1 FROM runs AS q
        WHERE q.sweep_id = s.id AND q.device_class = :device_class AND q.state = 'queued'
      )
    ORDER BY (busy.running + 1) / share.weight, served.last_started NULLS FIRST, s.id
    LIMIT :limit
    """
)

# Sweeps tried per claim: a sweep whose queued runs are all being taken by concurrent claims
# (locked) is passed over for the next one.
MAX_SWEEPS_TRIED = 8


def ranked_sweeps(
    session: Session, device_class: str, aging_s: float, project_id: int | None = None
) -> list[int]:
    """Sweeps to take a run from, best first; only ``project_id``'s for a pinned device."""
    return list(
        session.scalars(
            _RANKED_SWEEPS,
            {
                "device_class": device_class,
                "aging_s": aging_s,
                "project_id": project_id,
                "limit": MAX_SWEEPS_TRIED,
                **{priority.value: weight for priority, weight in PRIORITY_WEIGHTS.items()},
            },
        )
    )


def take_next_run(
    session: Session,
    device_class: str,
    device_udid: str,
    aging_s: float,
    project_id: int | None = None,
) -> Run | None:
    """Lock the next run for this device (SKIP LOCKED), or None when nothing is claimable."""
    for sweep_id in ranked_sweeps(session, device_class, aging_s, project_id):
        # Within a sweep: the least tried first, in the sweep's A B B A order, and a run that
        # failed on this very device only when no other is left (a retry lands elsewhere).
        # Both reads walk ix_runs_claim_order and stop at the first unlocked row.
        for elsewhere in (True, False):
            statement = (
                select(Run)
                .where(
                    Run.sweep_id == sweep_id,
                    Run.device_class == device_class,
                    Run.state == RunState.queued,
                    Run.device_udid.is_distinct_from(device_udid)
                    if elsewhere
                    else Run.device_udid == device_udid,
                )
                .order_by(Run.attempts, Run.order_key, Run.id)
                .limit(1)
                .with_for_update(skip_locked=True)
            )
            run = session.scalar(statement)
            if run is not None:
                return run
    return None
