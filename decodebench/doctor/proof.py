"""The proof of a repair: candidates decoded teacher-forced against a reference, compared.

Every prompt goes through each stepper (its prefill function if it has one, else a token at a
time), then the reference's greedy tokens are stepped through all of them; per prompt and per
comparison: the first step whose argmax differs (with the reference's top-1 minus top-2 margin
there), the largest logit difference, and a candidate's first non-finite value. The doctor's
repair (:mod:`decodebench.doctor.repair`) decides on these what to keep.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Protocol

import numpy as np

from decodebench.contracts.doctor import Agreement, PromptAgreement
from decodebench.formats.coreml.interpreter import NonFiniteError

REFERENCE = "reference"  # the package's own fp32 run, the teacher of the proof


class Stepper(Protocol):
    def reset(self) -> None: ...

    def step(self, token: int, position: int) -> np.ndarray: ...


def top_margin(logits: np.ndarray) -> float:
    """The best logit minus the second best."""
    second, first = np.partition(logits, -2)[-2:]
    return float(first - second)


@dataclass
class _Comparison:
    divergent: int | None = None
    worst: float = 0.0
    broken: str | None = None
    margin: float | None = None

    def row(self, index: int) -> PromptAgreement:
        return PromptAgreement(
            index=index,
            identical=self.divergent is None and self.broken is None,
            first_divergent_step=self.divergent,
            max_abs_logit_diff=self.worst,
            non_finite=self.broken,
            reference_margin=self.margin,
        )


@dataclass
class _PromptRun:
    """One prompt of a proof: every live stepper computes the same thing, compared."""

    reference: Stepper
    live: dict[str, Stepper]
    found: dict[tuple[str, str], _Comparison]
    explain: Callable[[NonFiniteError], str]
    generated: list[int] = field(default_factory=list)
    errors: dict[str, NonFiniteError] = field(default_factory=dict)

    def run(self, compute: Callable[[Stepper], np.ndarray], step: int) -> None:
        """``compute`` on the reference and each live candidate, then the comparisons; the
        reference's greedy token (at the last row) is appended to ``generated``."""
        logits = {REFERENCE: compute(self.reference)}
        for name in list(self.live):
            try:
                logits[name] = compute(self.live[name])
            except NonFiniteError as error:
                self.errors[name] = error
                del self.live[name]
                for key, comparison in self.found.items():
                    if name in key and comparison.broken is None:
                        comparison.broken = self.explain(error)
                        if comparison.divergent is None:
                            comparison.divergent = step
        for (expected_name, actual_name), comparison in self.found.items():
            if comparison.broken is not None:
                continue
            expected, actual = _rows(logits[expected_name]), _rows(logits[actual_name])
            shared = min(len(expected), len(actual))  # a prefill may return fewer rows
            expected, actual = expected[-shared:], actual[-shared:]
            comparison.worst = max(comparison.worst, float(np.max(np.abs(actual - expected))))
            if comparison.divergent is None:
                if int(np.argmax(actual[-1])) != int(np.argmax(expected[-1])):
                    comparison.divergent = step
                    comparison.margin = top_margin(expected[-1])
        self.generated.append(int(np.argmax(_rows(logits[REFERENCE])[-1])))


def _rows(logits: np.ndarray) -> np.ndarray:
    return logits.reshape(-1, logits.shape[-1])


@dataclass
class Proof:
    tokens: list[list[int]]  # the reference's greedy tokens, per prompt
    agreements: dict[str, Agreement]  # candidate -> against the reference
    pairs: dict[tuple[str, str], Agreement]  # (expected, actual) -> agreement
    errors: dict[str, dict[int, NonFiniteError]]  # candidate -> prompt -> its non-finite value


def prompt_logits(stepper: Stepper, prompt: Sequence[int]) -> np.ndarray:
    """The prompt's logits [positions, vocab]: through the stepper's prefill function if it has
    one (as a phone runs the prompt), else one token at a time."""
    if getattr(stepper, "has_prefill", False):
        return np.asarray(stepper.prefill(prompt))  # type: ignore[attr-defined]
    return np.stack([stepper.step(token, position) for position, token in enumerate(prompt)])


def _step(stepper: Stepper, token: int, position: int) -> np.ndarray:
    return stepper.step(token, position)


def prove(
    reference: Stepper,
    candidates: Mapping[str, Stepper],
    prompts: Sequence[Sequence[int]],
    steps: int,
    *,
    pairs: Sequence[tuple[str, str]] = (),
    after_prompt: Callable[[int], None] | None = None,
    explain: Callable[[NonFiniteError], str] = str,
) -> Proof:
    """Decode every prompt with ``reference`` and compare each candidate, teacher-forced.

    Each prompt goes through a stepper's prefill function when it has one (else one token at a
    time); the prompt's logits count in the logit error, and a different argmax at its last
    position is a divergence at step 0. Then the reference's greedy tokens are stepped.

    ``pairs`` are more comparisons, ``(expected, actual)`` among :data:`REFERENCE` and the
    candidates' names, on the same teacher-forced context: a first divergent step up to the one
    where the reference's own tokens leave ``expected``'s is the free-running one; past it the
    context is the reference's, not ``expected``'s. ``after_prompt(index)`` is called when a
    prompt is done; ``explain`` words a candidate's non-finite value.
    """
    if REFERENCE in candidates:
        raise ValueError(f"a candidate cannot be named {REFERENCE!r}: that is the teacher")
    comparisons = [(REFERENCE, name) for name in candidates] + list(pairs)
    rows: dict[tuple[str, str], list[PromptAgreement]] = {key: [] for key in comparisons}
    errors: dict[str, dict[int, NonFiniteError]] = {name: {} for name in candidates}
    tokens: list[list[int]] = []
    for index, prompt in enumerate(prompts):
        live = dict(candidates)
        reference.reset()
        for session in live.values():
            session.reset()
        found = {key: _Comparison() for key in comparisons}
        one = _PromptRun(reference, live, found, explain)
        one.run(partial(prompt_logits, prompt=prompt), 0)
        for step in range(1, steps):
            position = len(prompt) + step - 1
            token = one.generated[-1]
            one.run(partial(_step, token=token, position=position), step)
        for name, error in one.errors.items():
            errors[name][index] = error
        generated = one.generated
        tokens.append(generated)
        for key, comparison in found.items():
            rows[key].append(comparison.row(index))
        if after_prompt is not None:
            after_prompt(index)
    agreements = {
        name: Agreement(candidate=name, prompts=rows[(REFERENCE, name)]) for name in candidates
    }
    paired = {key: Agreement(candidate=key[1], prompts=rows[key]) for key in pairs}
    return Proof(tokens=tokens, agreements=agreements, pairs=paired, errors=errors)
