"""A finished sweep's verdicts, computed once and kept in its row for every server process.

The bootstrap behind the verdicts (server/sweeps/verdicts.py) is most of the time of a large
sweep's page, and its inputs stop changing once the sweep has ended: a succeeded run's prompts
are immutable. The first read of an ended sweep therefore computes the verdicts and stores them
in ``sweeps.verdict_cache`` together with a fingerprint of the succeeded runs they came from;
later reads, in any process, take them from there. A fingerprint that no longer matches (a run
retried and succeeded, late results taken after the sweep had failed) is recomputed, and
retrying a run empties the cache (server/sweeps/control.py). Sweeps still running are always
computed afresh, so nothing is written while agents upload.
"""

from __future__ import annotations

import hashlib
from typing import Any

from pydantic import ValidationError
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from decodebench.contracts.domain import SweepSpec
from decodebench.contracts.verdicts import VariantVerdict
from server.models import Run, RunState, Sweep, SweepState
from server.sweeps.verdicts import sweep_verdicts

FINAL = (SweepState.completed.value, SweepState.failed.value)


def runs_fingerprint(session: Session, sweep_id: int) -> str:
    """The succeeded runs of the sweep: the verdicts' only varying input."""
    ids = session.scalars(
        select(Run.id)
        .where(Run.sweep_id == sweep_id, Run.state == RunState.succeeded.value)
        .order_by(Run.id)
    ).all()
    return hashlib.sha256(",".join(map(str, ids)).encode()).hexdigest()


def _read(cache: dict[str, Any] | None, key: str) -> tuple[list[VariantVerdict], str | None] | None:
    if not cache or cache.get("key") != key:
        return None
    try:
        verdicts = [VariantVerdict.model_validate(row) for row in cache["verdicts"]]
    except (ValidationError, KeyError, TypeError):
        return None  # written by an older shape of the contract: computed again
    note = cache.get("note")
    return verdicts, note if isinstance(note, str) else None


def stored_verdicts(
    session: Session, sweep: Sweep, min_effect: float | None = None
) -> tuple[list[VariantVerdict], str | None]:
    """The sweep's verdicts at its own minimum effect: from the cache once it has ended."""
    own_effect = SweepSpec.model_validate(sweep.spec).min_effect
    if sweep.state not in FINAL or (min_effect is not None and min_effect != own_effect):
        return sweep_verdicts(session, sweep, min_effect)
    # The fingerprint is read before the runs the verdicts come from: a run succeeding in
    # between leaves a stale fingerprint, so the next read computes again (never the reverse).
    key = runs_fingerprint(session, sweep.id)
    cached = _read(session.scalar(select(Sweep.verdict_cache).where(Sweep.id == sweep.id)), key)
    if cached is not None:
        return cached
    verdicts, note = sweep_verdicts(session, sweep)
    session.execute(
        update(Sweep)
        .where(Sweep.id == sweep.id, Sweep.state.in_(FINAL))  # not if a retry reopened it
        .values(
            verdict_cache={
                "key": key,
                "verdicts": [verdict.model_dump(mode="json") for verdict in verdicts],
                "note": note,
            }
        )
        .execution_options(synchronize_session=False)
    )
    return verdicts, note
