"""The sweep page's charts, from the same SweepDetail the API serves plus per-prompt rates."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from markupsafe import Markup, escape
from sqlalchemy import select
from sqlalchemy.orm import Session

from decodebench.contracts.api import BuildView, ComparisonRow, SweepDetail
from server.models import PromptResultRow, Run, RunState, SweepVariant
from server.ui.charts import Bar, Point, StackedBar, bar_chart, scatter_chart, stacked_bar_chart

BYTE_SERIES = ("weights", "KV read", "KV write", "redundant")
MIB = 1024 * 1024


class PromptPair(NamedTuple):  # a thousand per large sweep: a tuple, not a validated model
    variant: str
    device_class: str
    prompt_index: int
    baseline_tok_s: float
    variant_tok_s: float


@dataclass(frozen=True)
class SweepCharts:
    tok_s: Markup | None
    bytes_per_token: Markup | None
    per_prompt: Markup | None
    pairs: list[PromptPair]
    pair_rows: Markup  # the pairs as the rows of the per-prompt table
    baseline: str | None


def verdict_of(row: ComparisonRow) -> object | None:
    """The faster/slower/no-change verdict, once the comparison carries one (the statistics
    work adds it to ComparisonRow); the page renders it whenever it is present."""
    return getattr(row, "verdict", None)


def tok_s_bars(rows: list[ComparisonRow]) -> list[Bar]:
    return [
        Bar(
            label=f"{row.variant} · {row.device_name}",
            value=row.decode_tok_s_mean,
            ci95=row.decode_tok_s_ci95,
            key=f"{row.variant}|{row.device_class}",
        )
        for row in rows
        if row.decode_tok_s_mean is not None
    ]


def byte_bars(builds: list[BuildView]) -> list[StackedBar]:
    bars = []
    for build in builds:
        if build.analysis is None:
            continue
        moved = build.analysis.bytes_per_token
        parts = [moved.weights, moved.kv_read, moved.kv_write, moved.redundant]
        bars.append(StackedBar(label=build.label, parts=[part / MIB for part in parts]))
    return bars


def prompt_pairs(session: Session, sweep_id: int) -> list[PromptPair]:
    """Each prompt's decode rate under each variant against the first variant's rate for the
    same prompt on the same device class and repetition."""
    rows = session.execute(
        select(
            SweepVariant.position,
            SweepVariant.label,
            Run.device_class,
            Run.repetition,
            PromptResultRow.prompt_index,
            PromptResultRow.decode_tok_s,
        )
        .join(Run, PromptResultRow.run_id == Run.id)
        .join(SweepVariant, Run.sweep_variant_id == SweepVariant.id)
        .where(Run.sweep_id == sweep_id, Run.state == RunState.succeeded.value)
    ).all()
    if not rows:
        return []
    first = min(row[0] for row in rows)
    baseline = {
        (device_class, repetition, prompt): rate
        for position, _, device_class, repetition, prompt, rate in rows
        if position == first
    }
    pairs: dict[tuple, PromptPair] = {}
    for position, label, device_class, repetition, prompt, rate in rows:
        before = baseline.get((device_class, repetition, prompt))
        if position == first or before is None:
            continue
        pairs[(label, device_class, repetition, prompt)] = PromptPair(
            label, device_class, prompt, before, rate
        )
    return sorted(pairs.values(), key=lambda p: (p.variant, p.device_class, p.prompt_index))


def pair_rows(pairs: list[PromptPair]) -> Markup:
    """The per-prompt table's rows. A large sweep has a thousand of them: written here in one
    pass (each name escaped once), they cost a fraction of what a template loop does."""
    escaped: dict[str, str] = {}

    def text(value: str) -> str:
        if value not in escaped:
            escaped[value] = str(escape(value))
        return escaped[value]

    return Markup(
        "".join(
            f"<tr><td>{text(pair.variant)}</td><td>{text(pair.device_class)}</td>"
            f"<td>{pair.prompt_index + 1}</td><td>{pair.baseline_tok_s:.1f}</td>"
            f"<td>{pair.variant_tok_s:.1f}</td></tr>"
            for pair in pairs
        )
    )


def sweep_charts(session: Session, detail: SweepDetail) -> SweepCharts:
    bars = tok_s_bars(detail.results)
    stacked = byte_bars(detail.builds)
    pairs = prompt_pairs(session, detail.id)
    baseline = detail.builds[0].label if detail.builds else None
    return SweepCharts(
        tok_s=bar_chart(bars, "Decode tokens per second, mean with 95% CI", "tok/s")
        if bars
        else None,
        bytes_per_token=stacked_bar_chart(stacked, BYTE_SERIES, "Bytes moved per token", "MiB")
        if stacked
        else None,
        per_prompt=scatter_chart(
            [
                Point(
                    x=p.baseline_tok_s, y=p.variant_tok_s, series=f"{p.variant} · {p.device_class}"
                )
                for p in pairs
            ],
            "Per-prompt decode tok/s: variant against baseline",
            f"{baseline} tok/s",
            "variant tok/s",
        )
        if pairs
        else None,
        pairs=pairs,
        pair_rows=pair_rows(pairs),
        baseline=baseline,
    )
