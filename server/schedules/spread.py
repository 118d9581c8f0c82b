"""Each device class's spread, learned from the project's stored repeated runs.

A group is the succeeded runs of one build on one device in one sweep (a nightly, its top-ups
and re-runs, or any sweep with repetitions); each run counts as its mean decode tok/s over its
prompts. The run-to-run spread is pooled within groups; the night-to-night spread comes from
consecutive groups of the same build on the same device (decodebench.judging.adaptive)."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime

from sqlalchemy import func, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from decodebench.contracts.schedules import SpreadView
from decodebench.contracts.verdicts import JudgingError
from decodebench.judging.adaptive import Spread, estimate_pooled_spread
from server import tenancy
from server.models import DeviceSpread, PromptResultRow, Run, RunState, Sweep


def stored_runs(session: Session, project_id: int, device_class: str) -> list[list[list[float]]]:
    """Per (build, device): its groups (one per sweep, oldest first) of run means."""
    rows = session.execute(
        select(Run.sweep_id, Run.build_id, Run.device_udid, func.avg(PromptResultRow.decode_tok_s))
        .join(PromptResultRow, PromptResultRow.run_id == Run.id)
        .join(Sweep, Sweep.id == Run.sweep_id)
        .where(
            Run.device_class == device_class,
            Run.state == RunState.succeeded,
            Sweep.project_id == project_id,
        )
        .group_by(Run.id)
        .order_by(Run.sweep_id, Run.id)
    ).all()
    groups: dict[tuple[int, str], dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for sweep_id, build_id, udid, mean in rows:
        groups[(build_id, udid or "")][sweep_id].append(float(mean))
    return [list(by_sweep.values()) for by_sweep in groups.values()]


def learn_spread(session: Session, project_id: int, device_class: str) -> DeviceSpread | None:
    """Estimate and store the class's spread; None while no group has two runs."""
    try:
        spread = estimate_pooled_spread(stored_runs(session, project_id, device_class))
    except JudgingError:
        return None
    values = {
        "run_spread": spread.run,
        "night_spread": spread.night,
        "runs": spread.runs,
        "nights": spread.nights,
        "learned_at": datetime.now(UTC),
    }
    session.execute(
        insert(DeviceSpread)
        .values(project_id=project_id, device_class=device_class, **values)
        .on_conflict_do_update(index_elements=["project_id", "device_class"], set_=values)
    )
    return stored_spread(session, project_id, device_class)


def stored_spread(session: Session, project_id: int, device_class: str) -> DeviceSpread | None:
    return session.scalar(
        select(DeviceSpread).where(
            DeviceSpread.project_id == project_id, DeviceSpread.device_class == device_class
        )
    )


def as_spread(row: DeviceSpread) -> Spread:
    return Spread(run=row.run_spread, night=row.night_spread, runs=row.runs, nights=row.nights)


def spread_view(row: DeviceSpread) -> SpreadView:
    return SpreadView(
        device_class=row.device_class,
        run_spread=row.run_spread,
        night_spread=row.night_spread,
        runs=row.runs,
        nights=row.nights,
        learned_at=row.learned_at,
    )


def project_spreads(session: Session) -> dict[str, SpreadView]:
    """The learned spread of each device class the session's project has one for."""
    project = tenancy.project_id(session)
    query = select(DeviceSpread).order_by(DeviceSpread.learned_at)
    if project is not None:
        query = query.where(DeviceSpread.project_id == project)
    return {row.device_class: spread_view(row) for row in session.scalars(query)}
