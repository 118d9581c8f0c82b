"""Output agreement: does the variant produce the baseline's greedy tokens, prompt by prompt?"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from decodebench.contracts.verdicts import OutputAgreement
from decodebench.judging.measurements import RunMeasurement


def first_divergence(reference: Sequence[int], candidate: Sequence[int]) -> int | None:
    """0-based position of the first differing token; a length difference counts at its end."""
    for position, (expected, got) in enumerate(zip(reference, candidate, strict=False)):
        if expected != got:
            return position
    if len(reference) != len(candidate):
        return min(len(reference), len(candidate))
    return None


def _tokens(runs: Sequence[RunMeasurement], prompt: int) -> tuple[int, ...] | None:
    # Greedy decoding is deterministic, so the first run that recorded ids speaks for all.
    for run in runs:
        ids = run.by_prompt()[prompt].token_ids
        if ids is not None:
            return ids
    return None


def output_agreement(
    pairs: Sequence[tuple[RunMeasurement, RunMeasurement]], prompts: Sequence[int]
) -> OutputAgreement | None:
    """Over the prompts both sides recorded token ids for; None when there are no such prompts."""
    baseline_runs = [pair[0] for pair in pairs]
    variant_runs = [pair[1] for pair in pairs]
    return _agreement(
        (prompt, _tokens(baseline_runs, prompt), _tokens(variant_runs, prompt))
        for prompt in prompts
    )


def reference_agreement(
    runs: Sequence[RunMeasurement], references: Sequence[Sequence[int]]
) -> OutputAgreement | None:
    """A variant's greedy tokens against the fp32 reference outputs (indexed by prompt), over
    the prompts its runs recorded token ids for; None when they recorded none."""
    return _agreement(
        (prompt, reference, _tokens([run for run in runs if prompt in run.by_prompt()], prompt))
        for prompt, reference in enumerate(references)
    )


def _agreement(
    compared_prompts: Iterable[tuple[int, Sequence[int] | None, Sequence[int] | None]],
) -> OutputAgreement | None:
    """Over (prompt, reference tokens, candidate tokens), skipping prompts either side lacks:
    the identical share, where divergent prompts first differ, and which they are."""
    divergences: dict[int, int] = {}
    compared = 0
    for prompt, reference, candidate in compared_prompts:
        if reference is None or candidate is None:
            continue
        compared += 1
        position = first_divergence(reference, candidate)
        if position is not None:
            divergences[prompt] = position
    if not compared:
        return None
    return OutputAgreement(
        prompts_compared=compared,
        identical_share=(compared - len(divergences)) / compared,
        mean_first_divergence=(
            sum(divergences.values()) / len(divergences) if divergences else None
        ),
        diverging_prompts=tuple(sorted(divergences)),
    )
