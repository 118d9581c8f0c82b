"""Verdicts: a variant against the baseline on one device class, with bootstrap intervals.

The design being respected: every variant runs the same prompts on the same device, and the
variants' runs alternate A B B A, so repetition r of the variant and of the baseline form a
pair measured back to back. The noise has two levels that do not shrink with more tokens: which
prompt (prompts differ in length and content, and both variants see the same ones) and which run
(a run carries an offset of its own: background work, DVFS, the device's thermal history).

The interval comes from `scipy.stats.bootstrap` over *indices*: one sample is the paired prompt
indices, the other the paired repetition indices, resampled independently (a two-way "pigeonhole"
bootstrap for crossed prompts × runs, Owen 2007). A resampled prompt brings its values from both
variants in every run; a resampled repetition brings both variants' runs of that round. Tokens
are never resampled: they are averaged inside a prompt, as the harness does. With a single run
per variant only prompts can be resampled and the interval cannot include run-to-run spread;
the row says so in its notes. See docs/statistics.md.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence

import numpy as np
from scipy import stats as scipy_stats

from decodebench.contracts.verdicts import (
    CONFIDENCE_LEVEL,
    DEFAULT_MIN_EFFECT,
    MAX_MIN_EFFECT,
    JudgingError,
    Metric,
    MetricComparison,
    VariantVerdict,
    Verdict,
    verdict_label,
)
from decodebench.judging.agreement import output_agreement
from decodebench.judging.measurements import RunMeasurement, VariantRuns

DEFAULT_RESAMPLES = 2000
FEW_RUN_PAIRS = 3


def check_min_effect(min_effect: float) -> float:
    if not (math.isfinite(min_effect) and 0 <= min_effect <= MAX_MIN_EFFECT):
        raise JudgingError(
            f"min_effect is {min_effect!r}; it must be between 0 and {MAX_MIN_EFFECT:g} "
            f"(0-{MAX_MIN_EFFECT:.0%})"
        )
    return min_effect


def decide(metric: Metric, ratio: float, low: float, high: float, min_effect: float) -> Verdict:
    """Better/worse when the interval excludes 1 and the ratio clears the minimum effect."""
    increased = low > 1 and ratio >= 1 + min_effect
    decreased = high < 1 and ratio <= 1 - min_effect
    if not (increased or decreased):
        return Verdict.no_significant_change
    return Verdict.better if increased == metric.higher_is_better else Verdict.worse


def ratio_interval(
    baseline: np.ndarray,
    variant: np.ndarray,
    *,
    seed: int = 0,
    n_resamples: int = DEFAULT_RESAMPLES,
    confidence_level: float = CONFIDENCE_LEVEL,
) -> tuple[float, float, float, tuple[str, ...]]:
    """mean(variant) / mean(baseline) with a bootstrap interval over runs (rows) × prompts.

    Both arrays are (run pairs, prompts), aligned: row r is repetition r, column p prompt p.
    Returns (ratio, low, high, resampled units).
    """
    if baseline.shape != variant.shape or baseline.ndim != 2:
        raise JudgingError(f"paired arrays differ: {baseline.shape} vs {variant.shape}")
    ratio = float(variant.mean() / baseline.mean())
    runs, prompts = baseline.shape
    samples: list[np.ndarray] = []
    resampled: list[str] = []
    if prompts >= 2:
        samples.append(np.arange(prompts))
        resampled.append("prompts")
    if runs >= 2:
        samples.append(np.arange(runs))
        resampled.append("runs")
    if not samples or (np.ptp(baseline) == 0 and np.ptp(variant) == 0):
        return ratio, ratio, ratio, ()  # nothing varies: the ratio is exact

    def statistic(*indices: np.ndarray, axis: int = -1) -> np.ndarray:
        # scipy hands over resampled (or jackknifed) index arrays, batched on leading axes.
        chosen = dict(zip(resampled, indices, strict=True))
        batch = np.broadcast_shapes(*(index.shape[:-1] for index in indices))
        whole = np.zeros((*batch, 1), dtype=int)
        prompt_index = chosen.get("prompts", whole)
        run_index = chosen.get("runs", whole)
        rows, columns = run_index[..., :, None], prompt_index[..., None, :]
        return variant[rows, columns].mean(axis=(-2, -1)) / baseline[rows, columns].mean(
            axis=(-2, -1)
        )

    result = _bootstrap(samples, statistic, seed, n_resamples, confidence_level)
    return ratio, result[0], result[1], tuple(resampled)


def _bootstrap(
    samples: list[np.ndarray],
    statistic: Callable[..., np.ndarray],
    seed: int,
    n_resamples: int,
    confidence_level: float,
) -> tuple[float, float]:
    # BCa corrects the percentile interval for the skew of a ratio; when its jackknife is
    # degenerate (e.g. one prompt dominates), fall back to the plain percentile interval.
    for method in ("BCa", "percentile"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            interval = scipy_stats.bootstrap(
                tuple(samples),
                statistic,
                n_resamples=n_resamples,
                vectorized=True,
                paired=False,
                confidence_level=confidence_level,
                method=method,
                rng=np.random.default_rng(seed),
            ).confidence_interval
        low, high = float(interval.low), float(interval.high)
        if math.isfinite(low) and math.isfinite(high):
            return low, high
    raise JudgingError("the bootstrap interval is not finite")


def _paired_runs(
    baseline: VariantRuns, variant: VariantRuns
) -> tuple[list[tuple[RunMeasurement, RunMeasurement]], list[int], list[str]]:
    base_runs, variant_runs = baseline.by_repetition(), variant.by_repetition()
    repetitions = sorted(set(base_runs) & set(variant_runs))
    if not repetitions:
        raise JudgingError(
            f"{variant.device_class}: no repetition has a run of both {baseline.variant!r} "
            f"(repetitions {sorted(base_runs)}) and {variant.variant!r} "
            f"(repetitions {sorted(variant_runs)})"
        )
    notes = []
    unpaired = len(base_runs) + len(variant_runs) - 2 * len(repetitions)
    if unpaired:
        notes.append(f"{unpaired} run(s) without a partner in the other variant left out")
    pairs = [(base_runs[r], variant_runs[r]) for r in repetitions]
    prompt_sets = [set(run.by_prompt()) for pair in pairs for run in pair]
    prompts = sorted(set.intersection(*prompt_sets))
    if not prompts:
        raise JudgingError(
            f"{variant.device_class}: {baseline.variant!r} and {variant.variant!r} "
            "share no prompt_index across their paired runs"
        )
    if len(prompts) < max(len(s) for s in prompt_sets):
        notes.append(f"only the {len(prompts)} prompts measured in every paired run compared")
    return pairs, prompts, notes


def _matrix(
    pairs: Sequence[tuple[RunMeasurement, RunMeasurement]],
    prompts: Sequence[int],
    side: int,
    field: str,
) -> np.ndarray:
    return np.array(
        [[getattr(pair[side].by_prompt()[p], field) for p in prompts] for pair in pairs],
        dtype=float,
    )


def compare_metric(
    metric: Metric,
    baseline: np.ndarray,
    variant: np.ndarray,
    min_effect: float,
    *,
    seed: int = 0,
    n_resamples: int = DEFAULT_RESAMPLES,
) -> MetricComparison:
    """One metric from aligned (run pairs, prompts) arrays; a run-level metric has 1 column."""
    for name, values in (("baseline", baseline), ("variant", variant)):
        if not np.all(np.isfinite(values)):
            raise JudgingError(f"{metric.value}: the {name} has a non-finite value")
        if not np.all(values > 0):
            raise JudgingError(f"{metric.value}: the {name} has a value that is not positive")
    ratio, low, high, resampled = ratio_interval(
        baseline, variant, seed=seed, n_resamples=n_resamples
    )
    verdict = decide(metric, ratio, low, high, min_effect)
    return MetricComparison(
        metric=metric,
        baseline_mean=float(baseline.mean()),
        variant_mean=float(variant.mean()),
        ratio=ratio,
        ci_low=low,
        ci_high=high,
        min_effect=min_effect,
        verdict=verdict,
        label=verdict_label(metric, verdict),
        resampled=resampled,
        prompts=baseline.shape[1] if metric is not Metric.peak_memory_bytes else 0,
        run_pairs=baseline.shape[0],
    )


def judge_variant(
    baseline: VariantRuns,
    variant: VariantRuns,
    *,
    min_effect: float = DEFAULT_MIN_EFFECT,
    seed: int = 0,
    n_resamples: int = DEFAULT_RESAMPLES,
) -> VariantVerdict:
    """The verdict row for `variant` against `baseline` on their (shared) device class."""
    check_min_effect(min_effect)
    if baseline.device_class != variant.device_class:
        raise JudgingError(
            f"device classes differ: baseline {baseline.device_class!r}, "
            f"variant {variant.device_class!r}"
        )
    pairs, prompts, notes = _paired_runs(baseline, variant)
    if len(pairs) == 1:
        notes.append(
            "one run per variant: the interval covers prompt-to-prompt spread only, not "
            "run-to-run spread; use repetitions >= 2 (A B B A) for a verdict to rely on"
        )
    elif len(pairs) < FEW_RUN_PAIRS:
        notes.append(f"{len(pairs)} run pairs: run-to-run spread is only roughly estimated")
    options = {"seed": seed, "n_resamples": n_resamples}
    rows = {
        metric: compare_metric(
            metric,
            _matrix(pairs, prompts, 0, metric.value),
            _matrix(pairs, prompts, 1, metric.value),
            min_effect,
            **options,
        )
        for metric in (Metric.decode_tok_s, Metric.ttft_ms)
    }
    memory = [[float(pair[side].peak_memory_bytes)] for side in (0, 1) for pair in pairs]
    half = len(pairs)
    rows[Metric.peak_memory_bytes] = compare_metric(
        Metric.peak_memory_bytes,
        np.array(memory[:half]),
        np.array(memory[half:]),
        min_effect,
        **options,
    )
    return VariantVerdict(
        variant=variant.variant,
        baseline=baseline.variant,
        device_class=variant.device_class,
        decode_tok_s=rows[Metric.decode_tok_s],
        ttft_ms=rows[Metric.ttft_ms],
        peak_memory_bytes=rows[Metric.peak_memory_bytes],
        agreement=output_agreement(pairs, prompts),
        notes=tuple(notes),
    )


def judge_sweep(
    arms: Sequence[VariantRuns],
    *,
    baseline: str | None = None,
    min_effect: float = DEFAULT_MIN_EFFECT,
    seed: int = 0,
    n_resamples: int = DEFAULT_RESAMPLES,
) -> list[VariantVerdict]:
    """Every variant against the baseline (the first variant unless named), per device class."""
    check_min_effect(min_effect)
    if not arms:
        raise JudgingError("no measured variant to judge")
    names = list(dict.fromkeys(arm.variant for arm in arms))
    baseline_name = baseline if baseline is not None else names[0]
    if baseline_name not in names:
        raise JudgingError(f"baseline {baseline_name!r} is not a variant; known: {names}")
    by_cell = {(arm.variant, arm.device_class): arm for arm in arms}
    device_classes = list(dict.fromkeys(arm.device_class for arm in arms))
    rows = []
    for device_class in device_classes:
        reference = by_cell.get((baseline_name, device_class))
        if reference is None:
            raise JudgingError(f"baseline {baseline_name!r} has no runs on {device_class}")
        for name in names:
            arm = by_cell.get((name, device_class))
            if name == baseline_name or arm is None:
                continue
            rows.append(
                judge_variant(
                    reference, arm, min_effect=min_effect, seed=seed, n_resamples=n_resamples
                )
            )
    return rows
