"""The side-by-side table: variant x device, measured against predicted, with speed-ups."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from statistics import fmean

from sqlalchemy import select
from sqlalchemy.orm import Session

from decodebench.contracts.api import AnalysisSummary, ComparisonRow
from decodebench.contracts.names import DEFAULT_FORMAT, FormatName
from decodebench.stats import summarize
from server.builds.views import analysis_summary
from server.models import BuildState, PromptResultRow, Run, RunState, Sweep
from server.profiles.service import current_profiles


def comparison(
    session: Session,
    sweep: Sweep,
    runs: list[Run],
    analyses: Mapping[int, AnalysisSummary | None] | None = None,
) -> list[ComparisonRow]:
    """One row per (variant, device class), in the sweep's variant order. ``analyses``: each
    build's summary by build id when the caller has them already (each costs a validation of
    the build's report)."""
    rates: dict[tuple[int, str], list[float]] = defaultdict(list)
    simulated: dict[tuple[int, str], set[bool]] = defaultdict(set)
    rows = session.execute(
        select(
            Run.sweep_variant_id,
            Run.device_class,
            PromptResultRow.decode_tok_s,
            PromptResultRow.simulated,
        )
        .join(PromptResultRow, PromptResultRow.run_id == Run.id)
        .where(Run.sweep_id == sweep.id, Run.state == RunState.succeeded)
    ).all()
    for variant_id, device_class, decode_tok_s, is_simulated in rows:
        rates[(variant_id, device_class)].append(decode_tok_s)
        simulated[(variant_id, device_class)].add(is_simulated)
    runs_by_cell: dict[tuple[int, str], list[Run]] = defaultdict(list)
    for run in runs:
        runs_by_cell[(run.sweep_variant_id, run.device_class)].append(run)

    profiles = current_profiles(session)
    if analyses is None:
        analyses = {v.build_id: analysis_summary(v.build, profiles) for v in sweep.variants}
    table: list[ComparisonRow] = []
    for device_class in sweep.spec["devices"]:
        profile = profiles[device_class]
        baseline: float | None = None
        for sweep_variant in sweep.variants:
            cell = (sweep_variant.id, device_class)
            analysis = analyses.get(sweep_variant.build_id)
            samples = rates.get(cell, [])
            summary = summarize(samples) if samples else None
            if sweep_variant.position == 0:
                baseline = summary.mean if summary else None
            cell_runs = runs_by_cell.get(cell, [])
            table.append(
                ComparisonRow(
                    variant=sweep_variant.label,
                    build_id=sweep_variant.build_id,
                    build_state=BuildState(sweep_variant.build.state),
                    device_class=device_class,
                    device_name=profile.display_name,
                    runs_total=len(cell_runs),
                    runs_succeeded=sum(run.state == RunState.succeeded for run in cell_runs),
                    runs_failed=sum(run.state == RunState.failed for run in cell_runs),
                    prompts_measured=len(samples),
                    decode_tok_s_mean=summary.mean if summary else None,
                    decode_tok_s_ci95=(
                        summary.ci95_half_width if summary and summary.n > 1 else None
                    ),  # one sample has no interval
                    speedup_vs_first=(
                        summary.mean / baseline if summary is not None and baseline else None
                    ),
                    predicted_tok_s=(
                        analysis.predicted_tok_s.get(device_class) if analysis else None
                    ),
                    prediction_calibrated=profile.calibrated,
                    prediction_source=profile.source,
                    tile_ops=analysis.tile_ops if analysis else None,
                    tile_mib=analysis.tile_output_mib if analysis else None,
                    bytes_per_token=analysis.bytes_per_token.total if analysis else None,
                    simulated=(True in simulated[cell]) if cell in simulated else None,
                    format=FormatName(sweep_variant.variant.get("format", DEFAULT_FORMAT)),
                    load_time_cold_ms=_mean_of(cell_runs, "load_time_cold_ms"),
                    load_time_warm_ms=_mean_of(cell_runs, "load_time_warm_ms"),
                )
            )
    return table


def _mean_of(runs: list[Run], field: str) -> float | None:
    """The mean of one summary field (a load time) over the succeeded runs that have it."""
    values = [
        run.summary[field]
        for run in runs
        if run.state == RunState.succeeded and run.summary and run.summary.get(field) is not None
    ]
    return fmean(values) if values else None
