"""The prompts a build of a model with a tokenizer carries reference outputs for.

Such a build is keyed by its prompt set and decode length too (``SweepSpec.reference_identity``),
so every sweep sharing it asks for the same prompts: the worker is told them with the build's
assignment, computes the fp32 reference outputs, and the report it completes with must carry
exactly those (checked here, so a run is never handed prompts the build has no answers for).
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from decodebench.contracts.build import BuildReport
from decodebench.contracts.domain import SweepSpec, prompt_set_identity
from decodebench.contracts.presets import has_tokenizer
from decodebench.contracts.workers import PromptSetRequest
from server.errors import InvalidInput
from server.models import Build, Sweep, SweepVariant


def prompt_set_of(session: Session, build: Build) -> PromptSetRequest | None:
    """What the build's reference outputs are for; None for models without a tokenizer."""
    if not has_tokenizer(build.model):
        return None
    sweep = session.scalar(
        select(Sweep)
        .join(SweepVariant, SweepVariant.sweep_id == Sweep.id)
        .where(SweepVariant.build_id == build.id)
        .order_by(Sweep.id)
        .limit(1)
    )
    if sweep is None:
        return None
    spec = SweepSpec.model_validate(sweep.spec)
    return PromptSetRequest(
        texts=spec.prompt_texts,
        count=spec.prompts,
        decode_tokens=spec.decode_tokens,
        identity=prompt_set_identity(spec.prompt_texts, spec.prompts, spec.decode_tokens),
    )


def check_references(session: Session, build: Build, report: BuildReport) -> None:
    """A build of a model with a tokenizer completes only with the references it was keyed by."""
    wanted = prompt_set_of(session, build)
    if wanted is None:
        return
    references = report.references
    if references is None:
        raise InvalidInput(
            f"report.references: build {build.id} is of {build.model}, which has a tokenizer; "
            "its report must carry the prompts' reference outputs"
        )
    if references.identity != wanted.identity:
        raise InvalidInput(
            f"report.references.identity {references.identity} is not the build's {wanted.identity}"
        )
    if len(references.prompts) != wanted.count or any(
        len(prompt.reference_ids) != wanted.decode_tokens for prompt in references.prompts
    ):
        raise InvalidInput(
            f"report.references: expected {wanted.count} prompts of {wanted.decode_tokens} "
            "reference tokens each"
        )
