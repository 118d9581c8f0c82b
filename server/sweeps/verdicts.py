"""Verdicts on a sweep: every variant against its baseline, per device class, from the runs'
per-prompt results (decodebench.judging does the statistics)."""

from __future__ import annotations

from collections import defaultdict

from sqlalchemy import select
from sqlalchemy.orm import Session

from decodebench.contracts.domain import SweepSpec
from decodebench.contracts.verdicts import JudgingError, VariantVerdict
from decodebench.judging.measurements import PromptMeasurement, RunMeasurement, VariantRuns
from decodebench.judging.verdicts import judge_sweep, judge_variant
from server.errors import InvalidInput
from server.models import PromptResultRow, Run, RunState, Sweep


def measured_arms(session: Session, sweep: Sweep) -> list[VariantRuns]:
    """Each (variant, device class)'s succeeded runs with their prompts, in the sweep's order."""
    runs = session.scalars(
        select(Run).where(Run.sweep_id == sweep.id, Run.state == RunState.succeeded)
    ).all()
    prompts: dict[int, list[PromptMeasurement]] = defaultdict(list)
    for row in session.scalars(
        select(PromptResultRow)
        .join(Run, PromptResultRow.run_id == Run.id)
        .where(Run.sweep_id == sweep.id, Run.state == RunState.succeeded)
        .order_by(PromptResultRow.run_id, PromptResultRow.prompt_index)
    ):
        prompts[row.run_id].append(
            PromptMeasurement(
                prompt_index=row.prompt_index,
                decode_tok_s=row.decode_tok_s,
                ttft_ms=row.ttft_ms,
                token_ids=tuple(row.token_ids) if row.token_ids is not None else None,
            )
        )
    cells: dict[tuple[str, str], list[RunMeasurement]] = defaultdict(list)
    for run in runs:
        if not prompts.get(run.id) or not run.summary:
            continue
        cells[(run.variant.label, run.device_class)].append(
            RunMeasurement(
                repetition=run.repetition,
                device_udid=run.device_udid or "",
                peak_memory_bytes=int(run.summary["peak_memory_bytes"]),
                prompts=tuple(prompts[run.id]),
            )
        )
    order = {variant.label: position for position, variant in enumerate(sweep.variants)}
    return [
        VariantRuns(variant=label, device_class=device_class, runs=tuple(cell_runs))
        for (label, device_class), cell_runs in sorted(
            cells.items(), key=lambda item: (order.get(item[0][0], 0), item[0][1])
        )
    ]


def sweep_verdicts(
    session: Session, sweep: Sweep, min_effect: float | None = None
) -> tuple[list[VariantVerdict], str | None]:
    """The verdict rows, or none and why (nothing measured yet, the baseline not measured …)."""
    spec = SweepSpec.model_validate(sweep.spec)
    if min_effect is not None:
        spec = spec.model_copy(update={"min_effect": min_effect})
    arms = measured_arms(session, sweep)
    if len({arm.variant for arm in arms}) < 2:
        return [], "verdicts need two measured variants"
    try:
        rows = judge_sweep(arms, baseline=spec.baseline, min_effect=spec.min_effect, seed=sweep.id)
    except (JudgingError, ValueError) as error:  # ValueError: figures a verdict cannot use
        return [], str(error)
    return rows, None


def verdicts_against_sweep(
    session: Session, sweep: Sweep, baseline: Sweep, min_effect: float
) -> tuple[list[VariantVerdict], str | None]:
    """Each variant of ``sweep`` against the variant of the same label in ``baseline`` (an
    earlier sweep of the same model, e.g. last night's), per device class both measured."""
    if baseline.model != sweep.model:
        raise InvalidInput(
            f"baseline_sweep: sweep {baseline.id} measured {baseline.model}, "
            f"sweep {sweep.id} measures {sweep.model}"
        )
    before = {(arm.variant, arm.device_class): arm for arm in measured_arms(session, baseline)}
    rows, notes = [], []
    for arm in measured_arms(session, sweep):
        reference = before.get((arm.variant, arm.device_class))
        if reference is None:
            notes.append(
                f"{arm.variant} on {arm.device_class}: not measured in sweep {baseline.id}"
            )
            continue
        labelled = reference.model_copy(update={"variant": f"sweep {baseline.id}: {arm.variant}"})
        try:
            rows.append(judge_variant(labelled, arm, min_effect=min_effect, seed=sweep.id))
        except (JudgingError, ValueError) as error:
            notes.append(f"{arm.variant} on {arm.device_class}: {error}")
    if not rows and not notes:
        notes.append("nothing measured yet")
    return rows, "; ".join(notes) or None
