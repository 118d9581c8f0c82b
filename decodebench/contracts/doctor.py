"""What the doctor finds in a Core ML LLM, what it repairs and what it proves.

The reports of the curing pipeline, as the CLI prints them in JSON, the server stores them and
the report page reads them:

- :class:`HeadroomReport`: per op, the largest |value| of the package's own fp32 run against
  fp16's largest value, each hazard named by layer and role, and the first op of the fp16 run
  that produced a non-finite value;
- :class:`Waste`: an avoidable byte stream per decoded token, its fix and the predicted tok/s
  after it;
- :class:`RepairReport`: the repairs tried (:class:`NormRepair`, :class:`FoldReport`), each
  candidate's :class:`Agreement` with the fp32 reference on the prompts, what was applied;
- :class:`DoctorReport`: all of them for one package, with the analysis before and after.

Every number is finite (the interpreter refuses non-finite values), so a report is storable as
JSON.
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict

from decodebench.contracts.analysis import GraphAnalysis
from decodebench.contracts.base import Contract

FP16_MAX = 65504.0


class Report(Contract):
    model_config = ConfigDict(frozen=True, allow_inf_nan=False)


class PatternReport(Report):
    function: str
    kind: Literal["matmul", "sdpa"]
    score_op: str
    output_op: str
    query_heads: int | None
    kv_heads: int | None
    query_length: int | None
    head_mapping: str | None
    replication_ops: list[str]
    replicated_bytes: int
    status: Literal["rewritten", "refused"]
    reasons: list[str]


class FoldReport(Report):
    patterns: list[PatternReport]
    stray_replications: list[str]
    removed_ops: dict[str, int]
    added_ops: dict[str, int]
    mask_alignments: list[str]

    @property
    def found(self) -> int:
        return len(self.patterns)

    @property
    def rewritten(self) -> int:
        return sum(pattern.status == "rewritten" for pattern in self.patterns)

    @property
    def refused(self) -> int:
        return sum(pattern.status == "refused" for pattern in self.patterns)


class NormRepair(Report):
    function: str
    label: str
    kind: str
    square_op: str
    status: str  # "rewritten" or "left"
    reason: str | None = None


class Hazard(Report):
    op: str
    op_type: str
    label: str
    layer: int | None
    role: str
    peak: float
    overflow_prompts: int
    close_prompts: int
    prompts: int
    # The prefill function the op belongs to (its name starts the label); None: decode's.
    function: str | None = None

    @property
    def overflows(self) -> bool:
        return self.overflow_prompts > 0

    def describe(self) -> str:
        if self.overflows:
            return (
                f"{self.label}: {self.peak:,.0f} > {FP16_MAX:,.0f} on {self.overflow_prompts} of "
                f"{self.prompts} prompts"
            )
        return (
            f"{self.label}: {self.peak:,.0f}, within {FP16_MAX / self.peak:.1f}x of "
            f"{FP16_MAX:,.0f} on {self.close_prompts} of {self.prompts} prompts"
        )


class NonFinite(Report):
    op: str
    op_type: str
    label: str
    prompt: int
    message: str
    # The prefill function it came from (its name starts the label); None: the decode function.
    function: str | None = None


class HeadroomReport(Report):
    package: str
    prompts: int
    steps: int
    margin: float
    hazards: list[Hazard]
    first_non_finite: NonFinite | None
    reference_tokens: list[list[int]]
    # The function a token decodes through, and the prefill function (sharing its states) each
    # prompt went through, if the package has one; its ops' peaks are hazards of their own.
    decode_function: str = "main"
    prefill_function: str | None = None

    @property
    def overflows(self) -> list[Hazard]:
        return [hazard for hazard in self.hazards if hazard.overflows]


class Waste(Report):
    kind: str
    what: str
    bytes_per_token: int
    fix: str
    applicable: bool  # can `decodebench repair` apply the fix to the package itself?
    predicted_tok_s_after: dict[str, float]


class PromptAgreement(Report):
    index: int
    identical: bool
    first_divergent_step: int | None
    max_abs_logit_diff: float
    non_finite: str | None = None
    # At the first divergent step: the reference's top-1 minus top-2 logit. Below the
    # candidate's logit error, the flip is rounding at a near tie, not a fault.
    reference_margin: float | None = None

    @property
    def near_tie(self) -> bool:
        """Diverged where the reference's two best tokens are closer than the logit error."""
        return self.reference_margin is not None and self.reference_margin < self.max_abs_logit_diff


class Agreement(Report):
    candidate: str
    prompts: list[PromptAgreement]

    @property
    def identical(self) -> int:
        return sum(prompt.identical for prompt in self.prompts)

    @property
    def share(self) -> float:
        return self.identical / len(self.prompts) if self.prompts else 0.0

    @property
    def max_abs_logit_diff(self) -> float:
        finite = [p.max_abs_logit_diff for p in self.prompts if p.non_finite is None]
        return max(finite, default=float("inf"))

    @property
    def non_finite(self) -> int:
        return sum(prompt.non_finite is not None for prompt in self.prompts)

    def improves_on(self, other: Agreement) -> bool:
        """More prompts with identical tokens, or as many and fewer with a non-finite value."""
        if self.identical != other.identical:
            return self.identical > other.identical
        return self.non_finite < other.non_finite

    def no_worse_than(self, other: Agreement) -> bool:
        return self.identical >= other.identical and self.non_finite <= other.non_finite

    def summary(self) -> str:
        divergent = {p.index: p.first_divergent_step for p in self.prompts if not p.identical}
        error = self.max_abs_logit_diff
        text = f"{self.identical}/{len(self.prompts)} prompts identical ({self.share:.0%}), " + (
            f"max |logit diff| {error:.4g}" if error != float("inf") else "no finite logits"
        )
        if self.non_finite:
            text += f", {self.non_finite} non-finite"
        steps = set(divergent.values())
        if len(divergent) > 4 and len(steps) == 1:  # e.g. every prompt non-finite at once
            text += f", all {len(divergent)} diverging at step {steps.pop()}"
        elif divergent:
            text += f", first divergent step by prompt {divergent}"
        return text

    def divergences(self) -> list[str]:
        """One line per prompt that is not identical: where, the margin, and what it means."""
        lines = []
        for prompt in self.prompts:
            if prompt.identical:
                continue
            if prompt.non_finite is not None:
                lines.append(
                    f"prompt {prompt.index}: non-finite at step {prompt.first_divergent_step}"
                )
                continue
            text = f"prompt {prompt.index}: diverges at step {prompt.first_divergent_step}"
            if prompt.reference_margin is not None:
                margin, error = prompt.reference_margin, prompt.max_abs_logit_diff
                verdict = (
                    "a near tie: rounding, not a fault" if prompt.near_tie else "not a near tie"
                )
                relation = "<" if prompt.near_tie else ">="
                text += (
                    f", reference top-1 - top-2 margin {margin:.4g} {relation} logit error "
                    f"{error:.4g} ({verdict})"
                )
            lines.append(text)
        return lines


class RepairReport(Report):
    source: str
    target: str
    prompts: int
    steps: int
    norms: list[NormRepair]
    fold: FoldReport | None
    original: Agreement
    candidates: list[Agreement]
    applied: list[str]
    refused: dict[str, str]
    reference_tokens: list[list[int]]
    # The decode function, and the prefill function every prompt of the proof went through
    # (for the reference and each candidate, as a phone runs the prompt), if there is one.
    decode_function: str = "main"
    prefill_function: str | None = None

    @property
    def result(self) -> Agreement:
        chosen = "+".join(self.applied) if self.applied else "original"
        for agreement in [self.original, *self.candidates]:
            if agreement.candidate == chosen:
                return agreement
        return self.original


class CheckpointAgreement(Report):
    """The package's fp32 run and the repaired package against transformers fp32's tokens."""

    weights: str
    reference: Agreement  # the package's own fp32 run against transformers fp32
    repaired: Agreement  # the repaired package (fp16) against transformers fp32


class DoctorReport(Report):
    """One package diagnosed, repaired and proven: the document ``decodebench doctor`` prints."""

    package: str
    prompts: int
    steps: int
    analysis: GraphAnalysis
    headroom: HeadroomReport
    waste: list[Waste]
    repair: RepairReport
    repaired_analysis: GraphAnalysis | None = None
    checkpoint: CheckpointAgreement | None = None
    seconds: float = 0.0
