"""Greedy tokens against the fp32 reference, and a few prompts' answers as text.

Builds of a model with a tokenizer carry their prompts' reference outputs (``build.json``'s
``references``, computed by the worker with transformers in fp32) and the address of the model's
detokenizer table (each token id's bytes). The server turns the runs' recorded token ids into
text with that table (decodebench.detokenize): no tokenizer library here. Runs that recorded no
token ids (simulated devices time tokens without computing them) show no text.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from sqlalchemy.orm import Session

from decodebench.contracts.api import PromptAnswers, SweepAnswers, VariantAnswer
from decodebench.contracts.build import ReferenceOutputs
from decodebench.contracts.verdicts import OutputAgreement
from decodebench.detokenize import DetokenizerError, detokenize, load_table
from decodebench.judging.agreement import first_divergence, reference_agreement
from decodebench.judging.measurements import VariantRuns
from server.build_reports import readable_report
from server.models import Sweep
from server.sweeps.verdicts import measured_arms

# Prompts whose answers the sweep page shows.
SHOWN_PROMPTS = 3


def references_of(sweep: Sweep) -> ReferenceOutputs | None:
    """The sweep's reference outputs: every build of its model carries the same ones."""
    for variant in sweep.variants:
        report, _ = readable_report(variant.build)  # an unreadable one is named elsewhere
        if report is not None and report.references is not None:
            return report.references
    return None


@lru_cache(maxsize=8)
def _table(path: Path) -> list[bytes] | None:
    try:
        return load_table(path.read_bytes())
    except (OSError, DetokenizerError):
        return None


def detokenizer(references: ReferenceOutputs) -> list[bytes] | None:
    from server.artifacts.endpoints import get_store

    if references.detokenizer_sha256 is None:
        return None
    path = get_store().path_for(references.detokenizer_sha256)
    return _table(path) if path.is_file() else None


def reference_agreements(
    references: ReferenceOutputs, arms: list[VariantRuns]
) -> dict[tuple[str, str], OutputAgreement]:
    expected = [prompt.reference_ids for prompt in references.prompts]
    found = {}
    for arm in arms:
        agreement = reference_agreement(arm.runs, expected)
        if agreement is not None:
            found[(arm.variant, arm.device_class)] = agreement
    return found


def sweep_answers(
    sweep: Sweep, references: ReferenceOutputs, arms: list[VariantRuns]
) -> SweepAnswers:
    table = detokenizer(references)
    shown = references.prompts[:SHOWN_PROMPTS]
    notes = []
    if table is None:
        notes.append("no detokenizer table for this model: answers are not shown as text")
    prompts = []
    for prompt in shown:
        answers = []
        for variant in sweep.variants:
            device_class, tokens = _tokens_of(arms, variant.label, prompt.index)
            answers.append(
                VariantAnswer(
                    variant=variant.label,
                    device_class=device_class,
                    text=detokenize(table, tokens) if tokens is not None and table else None,
                    first_divergence=(
                        first_divergence(prompt.reference_ids, tokens) if tokens else None
                    ),
                )
            )
        prompts.append(
            PromptAnswers(
                index=prompt.index,
                prompt=prompt.text,
                reference=prompt.reference_text,
                answers=answers,
            )
        )
    if any(answer.device_class is None for prompt in prompts for answer in prompt.answers):
        notes.append(
            "runs without token ids (simulated devices time tokens, they do not compute them)"
        )
    return SweepAnswers(
        reference=references.reference,
        decode_tokens=references.decode_tokens,
        prompts=prompts,
        note="; ".join(notes) or None,
    )


def _tokens_of(
    arms: list[VariantRuns], variant: str, prompt: int
) -> tuple[str | None, list[int] | None]:
    """The first recorded tokens of a variant for a prompt (greedy: every run decodes them)."""
    for arm in arms:
        if arm.variant != variant:
            continue
        for run in arm.runs:
            measured = run.by_prompt().get(prompt)
            if measured is not None and measured.token_ids is not None:
                return arm.device_class, list(measured.token_ids)
    return None, None


def answers_and_agreements(
    session: Session, sweep: Sweep
) -> tuple[SweepAnswers | None, dict[tuple[str, str], OutputAgreement]]:
    references = references_of(sweep)
    if references is None:
        return None, {}
    arms = measured_arms(session, sweep)
    return sweep_answers(sweep, references, arms), reference_agreements(references, arms)
