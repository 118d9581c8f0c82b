"""The prompts a run decodes, as its assignment carries them.

A model with a tokenizer: the token ids its build's worker made through the model's chat
template (the build carries them with their reference outputs). A preset: the agent
pseudo-tokenizes the built-in set, or the sweep's own texts when it brought some.
"""

from __future__ import annotations

from typing import NamedTuple

from decodebench.contracts.build import BuildReport
from decodebench.contracts.domain import SweepSpec


class RunPrompts(NamedTuple):
    prompt_set_version: str
    prompt_texts: list[str] | None
    prompt_token_ids: list[list[int]] | None


def prompts_of(spec: SweepSpec, report: BuildReport) -> RunPrompts:
    if report.references is not None:
        ids = [prompt.token_ids for prompt in report.references.prompts]
        return RunPrompts(spec.prompt_set_version, None, ids)
    return RunPrompts(spec.prompt_set_version, spec.prompt_texts, None)
