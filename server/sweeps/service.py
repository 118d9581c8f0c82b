"""Sweeps: a user's request expanded into builds and runs."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload

from decodebench.contracts.domain import SweepSpec
from decodebench.contracts.names import SweepPriority
from server import tenancy
from server.builds.service import get_or_create_build
from server.errors import NotFound
from server.models import BuildState, Run, RunState, Sweep, SweepState, SweepVariant
from server.runs.service import refresh_sweep_state
from server.transitions import record_created
from server.usermodels.service import variant_identities


def interleaved_order(repetition: int, position: int, variant_count: int) -> int:
    """A B, then B A, then A B …: thermal drift on one device cancels across variants."""
    within = position if repetition % 2 == 0 else variant_count - 1 - position
    return repetition * variant_count + within


def submit_sweep(
    session: Session,
    spec: SweepSpec,
    submitted_by: str,
    toolchain: dict[str, str],
    priority: SweepPriority = SweepPriority.adhoc,
    *,
    project_id: int,
) -> Sweep:
    """``priority`` is how it was submitted (a schedule: nightly); the spec's own wins."""
    identities = variant_identities(session, spec)  # 422 before anything is written
    sweep = Sweep(
        project_id=project_id,
        model=spec.model,
        spec=spec.model_dump(mode="json"),
        state=SweepState.building,
        submitted_by=submitted_by,
        priority=(spec.priority or priority).value,
    )
    session.add(sweep)
    session.flush()
    record_created(session, "sweep", sweep.id, SweepState.building, f"submitted by {submitted_by}")
    sweep_variants = []
    for position, variant in enumerate(spec.variants):
        build = get_or_create_build(
            session,
            spec.model,
            variant,
            toolchain,
            identities[position],
            spec.reference_identity(),
        )
        sweep_variant = SweepVariant(
            sweep_id=sweep.id,
            position=position,
            label=variant.label,
            variant=variant.model_dump(mode="json"),
            build_id=build.id,
        )
        session.add(sweep_variant)
        sweep_variants.append((sweep_variant, build))
    session.flush()
    for device_class in spec.devices:
        for repetition in range(spec.repetitions):
            for sweep_variant, build in sweep_variants:
                ready = build.state == BuildState.succeeded
                run = Run(
                    sweep_id=sweep.id,
                    sweep_variant_id=sweep_variant.id,
                    build_id=build.id,
                    device_class=device_class,
                    repetition=repetition,
                    order_key=interleaved_order(
                        repetition, sweep_variant.position, len(sweep_variants)
                    ),
                    state=RunState.queued if ready else RunState.waiting_build,
                    attempts=0,
                )
                session.add(run)
                session.flush()
                record_created(
                    session,
                    "run",
                    run.id,
                    run.state,
                    "build ready" if ready else "waiting for build",
                )
    refresh_sweep_state(session, sweep.id)
    return sweep


def get_sweep(session: Session, sweep_id: int) -> Sweep:
    sweep = session.scalar(
        select(Sweep)
        .where(Sweep.id == sweep_id, tenancy.sweeps(session))
        .options(selectinload(Sweep.variants).selectinload(SweepVariant.build))
    )
    if sweep is None:
        raise NotFound(f"no sweep {sweep_id}")
    return sweep


def list_sweeps(session: Session, limit: int = 100) -> list[Sweep]:
    # The list shows each sweep's variant labels: load them in one query, not one per sweep.
    return list(
        session.scalars(
            select(Sweep)
            .where(tenancy.sweeps(session))
            .order_by(Sweep.id.desc())
            .limit(limit)
            .options(selectinload(Sweep.variants))
        )
    )


def runs_of(session: Session, sweep_id: int) -> list[Run]:
    return list(
        session.scalars(
            select(Run).where(Run.sweep_id == sweep_id).order_by(Run.device_class, Run.order_key)
        )
    )
