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

from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import Integer, bindparam, cast, column, select, table, text
from sqlalchemy.orm import Session

from decodebench.contracts.names import SweepPriority
from server import tenancy
from server.models import Run, RunState

PRIORITY_WEIGHTS = {SweepPriority.ci: 4.0, SweepPriority.nightly: 2.0, SweepPriority.adhoc: 1.0}

# Which sweeps a device may take runs from is tenancy's rule (server/tenancy.py), for the
# device's pin given as :project_id.
_SWEEPS = table("sweeps", column("project_id")).alias("s")
_CLAIMABLE = str(tenancy.claimable(_SWEEPS.c.project_id, cast(bindparam("project_id"), Integer)))

_RANKED_SWEEPS = text(
    f"""
    SELECT s.id, busy.running, share.weight, s.priority, served.last_started
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
      AND ({_CLAIMABLE})
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


@dataclass
class Share:
    """A sweep's standing in the ranking, updated as a batch of claims takes its runs."""

    sweep_id: int
    running: int
    weight: float
    priority: str
    last_started: datetime | None

    def rank(self) -> tuple[float, bool, datetime, int]:
        # As the query's ORDER BY: share, then served longest ago (never served first), then id.
        never = self.last_started is None
        return (
            (self.running + 1) / self.weight,
            not never,
            self.last_started or _EPOCH,
            self.sweep_id,
        )

    def served(self, now: datetime) -> None:
        self.running += 1
        self.last_started = now
        self.weight = PRIORITY_WEIGHTS[SweepPriority(self.priority)]  # waited no time now


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def ranked_shares(
    session: Session, device_class: str, aging_s: float, project_id: int | None, limit: int
) -> list[Share]:
    """Up to ``limit`` sweeps to take a run from, best first; only ``project_id``'s for a
    pinned device."""
    rows = session.execute(
        _RANKED_SWEEPS,
        {
            "device_class": device_class,
            "aging_s": aging_s,
            "project_id": project_id,
            "limit": limit,
            **{priority.value: weight for priority, weight in PRIORITY_WEIGHTS.items()},
        },
    ).all()
    return [Share(row[0], int(row[1]), float(row[2]), row[3], row[4]) for row in rows]


def take_from_sweep(
    session: Session, sweep_id: int, device_class: str, device_udid: str
) -> Run | None:
    """Lock the sweep's next run for this device (SKIP LOCKED), or None."""
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


class BatchShares:
    """Runs for a batch of devices of one class (and pin) in fair-share order, from one ranking:
    after each run taken, its sweep's standing is updated here as the query would rank it
    again, so a batch of 50 claims reads the ranking once, not 50 times."""

    def __init__(
        self,
        session: Session,
        device_class: str,
        aging_s: float,
        project_id: int | None,
        devices: int,
    ) -> None:
        self.session = session
        self.device_class = device_class
        # A single claim tries MAX_SWEEPS_TRIED sweeps; each further device, one more.
        self.shares = ranked_shares(
            session, device_class, aging_s, project_id, MAX_SWEEPS_TRIED + devices - 1
        )

    def take(self, device_udid: str, now: datetime) -> Run | None:
        while self.shares:
            best = min(self.shares, key=Share.rank)
            run = take_from_sweep(self.session, best.sweep_id, self.device_class, device_udid)
            if run is not None:
                best.served(now)
                return run
            self.shares.remove(best)  # nothing left to take there (or all being taken)
        return None
