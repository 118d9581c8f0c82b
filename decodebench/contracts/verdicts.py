"""The judge's answers: one comparison per metric, output agreement, one row per variant."""

from __future__ import annotations

from enum import StrEnum

from pydantic import ConfigDict, Field

from decodebench.contracts.base import Contract

DEFAULT_MIN_EFFECT = 0.02
MAX_MIN_EFFECT = 0.5
CONFIDENCE_LEVEL = 0.95


class JudgingError(ValueError):
    """Input the judge cannot give a verdict on; the message names what is wrong."""


class Metric(StrEnum):
    decode_tok_s = "decode_tok_s"
    ttft_ms = "ttft_ms"
    peak_memory_bytes = "peak_memory_bytes"

    @property
    def higher_is_better(self) -> bool:
        return self is Metric.decode_tok_s


class Verdict(StrEnum):
    better = "better"
    worse = "worse"
    no_significant_change = "no significant change"


# What a verdict is called for each metric: tok/s and TTFT are speeds, memory is a size.
_LABELS = {
    Metric.decode_tok_s: {Verdict.better: "faster", Verdict.worse: "slower"},
    Metric.ttft_ms: {Verdict.better: "faster", Verdict.worse: "slower"},
    Metric.peak_memory_bytes: {Verdict.better: "less memory", Verdict.worse: "more memory"},
}


def verdict_label(metric: Metric, verdict: Verdict) -> str:
    return _LABELS[metric].get(verdict, Verdict.no_significant_change.value)


class MetricComparison(Contract):
    """Variant against baseline for one metric: ratio of means with its bootstrap interval."""

    model_config = ConfigDict(frozen=True)

    metric: Metric
    baseline_mean: float
    variant_mean: float
    ratio: float = Field(description="variant mean / baseline mean")
    ci_low: float
    ci_high: float
    confidence_level: float = CONFIDENCE_LEVEL
    min_effect: float = Field(description="Smallest relative change that counts, e.g. 0.02")
    verdict: Verdict
    label: str = Field(description="faster / slower / less memory / more memory / no …")
    resampled: tuple[str, ...] = Field(description="Units the bootstrap resampled")
    prompts: int = Field(ge=0, description="Prompts paired across the two variants")
    run_pairs: int = Field(ge=1, description="Repetitions measured for both variants")

    @property
    def regressed(self) -> bool:
        return self.verdict is Verdict.worse

    def interval_text(self) -> str:
        return f"{self.ratio:.3f}x [{self.ci_low:.3f}, {self.ci_high:.3f}]"


class OutputAgreement(Contract):
    """Greedy tokens of the variant against the baseline's, prompt by prompt."""

    model_config = ConfigDict(frozen=True)

    prompts_compared: int = Field(ge=1)
    identical_share: float = Field(ge=0, le=1)
    mean_first_divergence: float | None = Field(
        description="Mean 0-based position of the first differing token over diverging prompts"
    )
    diverging_prompts: tuple[int, ...]

    @property
    def identical(self) -> bool:
        return not self.diverging_prompts


class VariantVerdict(Contract):
    """One row of the judged comparison: a variant against the baseline on one device class."""

    model_config = ConfigDict(frozen=True)

    variant: str
    baseline: str
    device_class: str
    decode_tok_s: MetricComparison
    ttft_ms: MetricComparison
    peak_memory_bytes: MetricComparison
    agreement: OutputAgreement | None = Field(
        description="None when either side recorded no token ids"
    )
    notes: tuple[str, ...] = ()

    def comparisons(self) -> tuple[MetricComparison, ...]:
        return (self.decode_tok_s, self.ttft_ms, self.peak_memory_bytes)

    def regressions(self, metrics: tuple[Metric, ...]) -> tuple[MetricComparison, ...]:
        return tuple(c for c in self.comparisons() if c.metric in metrics and c.regressed)
