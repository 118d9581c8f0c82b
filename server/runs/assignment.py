"""What an agent receives when it claims a run."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from decodebench.contracts.build import BuildReport
from decodebench.contracts.domain import SweepSpec, VariantSpec
from decodebench.contracts.profiles import DeviceProfile
from decodebench.contracts.protocol import RunAssignment
from server.build_reports import report_of
from server.config import Settings
from server.models import Build, Run, Sweep, SweepVariant
from server.profiles.service import current_profiles
from server.runs import service as runs
from server.runs.prompts import prompts_of
from server.schedules.spread import stored_spread

logger = logging.getLogger(__name__)
_Assigned = tuple[Build, Sweep, SweepVariant]


def _runs_builds(session: Session, run_ids: Sequence[int]) -> dict[int, _Assigned]:
    """Each run's build, sweep and variant, in one round trip for any number of runs."""
    return {
        run_id: (build, sweep, variant)
        for run_id, build, sweep, variant in session.execute(
            select(Run.id, Build, Sweep, SweepVariant)
            .join(SweepVariant, SweepVariant.id == Run.sweep_variant_id)
            .join(Sweep, Sweep.id == SweepVariant.sweep_id)
            .join(Build, Build.id == Run.build_id)
            .where(Run.id.in_(run_ids))
        ).tuples()
    }


def assignment_for(
    session: Session,
    run: Run,
    settings: Settings,
    found: _Assigned | None = None,
    reports: dict[int, BuildReport | None] | None = None,
) -> RunAssignment:
    """The run's assignment; ``found`` (its build, sweep and variant) and ``reports`` (parsed
    reports by build) when a batch has read them already."""
    if found is None:
        found = _runs_builds(session, [run.id])[run.id]
    build, sweep, variant = found
    if reports is None:
        reports = {}
    if build.id not in reports:
        reports[build.id] = report_of(build)
    report = reports[build.id]
    assert report is not None
    assert build.artifact_sha256 is not None and run.lease_expires_at is not None
    return RunAssignment(
        run_id=run.id,
        sweep_id=sweep.id,
        build_id=build.id,
        model=build.model,
        variant=VariantSpec.model_validate(variant.variant),
        variant_label=variant.label,
        device_class=run.device_class,
        prompts=int(sweep.spec["prompts"]),
        decode_tokens=int(sweep.spec["decode_tokens"]),
        artifact_sha256=build.artifact_sha256,
        artifact_url=f"{settings.public_url}/api/v1/artifacts/{build.artifact_sha256}",
        bytes_per_token=report.analysis.bytes_per_token.total,
        dispatch_ops=report.analysis.dispatch_ops,
        vocab_size=report.config.vocab_size,
        lease_expires_at=run.lease_expires_at.isoformat(),
        lease_seconds=settings.lease_seconds,
        **prompts_of(SweepSpec.model_validate(sweep.spec), report)._asdict(),
        # What the sweep's predictions use (its project's calibration), so a simulated device
        # times the run with the same figures.
        device_profile=_profile_for(session, sweep, run.device_class),
    )


def _profile_for(session: Session, sweep: Sweep, device_class: str) -> DeviceProfile | None:
    """The class's current profile; with the spec's `learned_noise`, its run-to-run spread is
    the one learned from the project's stored runs (server/schedules/spread.py), when learned."""
    profile = current_profiles(session, sweep.project_id).get(device_class)
    if profile is None or not sweep.spec.get("learned_noise"):
        return profile
    learned = stored_spread(session, sweep.project_id, device_class)
    if learned is None:
        return profile
    noise = profile.noise.model_copy(
        update={
            "run_spread": min(learned.run_spread, 0.5),
            "source": f"run spread learned from {learned.runs} stored runs "
            f"({learned.learned_at:%Y-%m-%d %H:%M} UTC); the rest {profile.noise.source}",
        }
    )
    return profile.model_copy(update={"noise": noise})


# A claim gives up looking after this many unusable runs in one request; the next claim goes on.
MAX_UNUSABLE_RUNS_PER_CLAIM = 20


def claim_assignment(
    session: Session,
    agent_id: int,
    device_udid: str,
    settings: Settings,
    claim_key: str | None = None,
) -> tuple[RunAssignment | None, set[str]]:
    """Claim the next run for a device; with it, the device's class (what its long poll waits
    on, as `claim_assignments` gives the classes of a batch's devices). A run whose assignment
    cannot be built (a stored report that no longer reads, say) is failed with the reason, and
    the claim moves on to the next: one bad row must not jam its device class's queue."""
    device_class = ""
    for _ in range(MAX_UNUSABLE_RUNS_PER_CLAIM):
        run, device_class = runs.claim_run(
            session,
            agent_id,
            device_udid,
            settings.lease_seconds,
            claim_key=claim_key,
            max_attempts=settings.max_run_attempts,
            aging_s=settings.fair_share_aging_s,
        )
        if run is None:
            return None, {device_class}
        try:
            return assignment_for(session, run, settings), {device_class}
        except Exception as error:  # noqa: BLE001 - any defect of the stored rows fails this run only
            reason = f"cannot assign run {run.id}: {type(error).__name__}: {error}"[:500]
            logger.warning(reason)
            runs.fail_unassignable(session, run, reason)
    return None, {device_class}


def claim_assignments(
    session: Session, agent_id: int, claims: Sequence[tuple[str, str]], settings: Settings
) -> tuple[dict[str, RunAssignment], set[str]]:
    """`claim_assignment` for several devices of one agent: the assignments by device, and the
    classes of the devices left without one (what a batched long poll waits on). The runs'
    builds, sweeps and variants are read in one statement and each build's report parsed once.
    A run whose assignment cannot be built fails with the reason, as in a single claim; its
    device gets none this time and claims again."""
    taken, waiting = runs.claim_runs(
        session,
        agent_id,
        claims,
        settings.lease_seconds,
        max_attempts=settings.max_run_attempts,
        aging_s=settings.fair_share_aging_s,
    )
    if not taken:
        return {}, waiting
    by_run = _runs_builds(session, [run.id for run in taken.values()])
    reports: dict[int, BuildReport | None] = {}
    assignments: dict[str, RunAssignment] = {}
    for udid, run in taken.items():
        try:
            found = by_run[run.id]
            assignments[udid] = assignment_for(session, run, settings, found, reports)
        except Exception as error:  # noqa: BLE001 - any defect of the stored rows fails this run only
            reason = f"cannot assign run {run.id}: {type(error).__name__}: {error}"[:500]
            logger.warning(reason)
            runs.fail_unassignable(session, run, reason)
    return assignments, waiting
