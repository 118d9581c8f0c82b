"""Repair a saved ``.mlpackage``: apply every safe repair, prove each on prompts, keep what helps.

Repairs, in order: the overflow-safe norm rewrite (:mod:`decodebench.mil.norm_repair`) and the
GQA fold (:mod:`decodebench.mil.fold`). Each candidate program is proven against the package's
own fp32 run (:mod:`decodebench.mil.widen`) on the prompts: both decode each prompt then
``steps`` tokens, the candidate teacher-forced with the reference's tokens, so every step
compares logits for the same context. Per candidate: the share of prompts whose greedy tokens
are all the reference's, the first divergent step of each other prompt, the largest logit
difference, and the prompts where the candidate produced a non-finite value.

A norm repair is kept only if it improves agreement (more prompts with identical tokens, or as
many and fewer with a non-finite value): a smaller logit error alone does not pay for its ops. The
fold, a speed repair that is exact, is kept if it does not make agreement worse. The output package holds what was kept; with nothing kept it is a byte copy of the input.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from decodebench.contracts.doctor import Agreement, PromptAgreement, RepairReport
from decodebench.mil.cache_io import Session, decode_session
from decodebench.mil.fold import fold_program
from decodebench.mil.fold_package import copy_package
from decodebench.mil.interpreter import Interpreter, NonFiniteError
from decodebench.mil.norm_repair import repair_norms
from decodebench.mil.program import MilError, load_package, save_package
from decodebench.mil.widen import widen_program

REPAIR_METADATA_KEY = "decodebench.repair"


def _session(program: Any, label: str) -> Session:
    return decode_session(Interpreter(program), label)


def prove(
    reference: Session,
    candidates: dict[str, Session],
    prompts: Sequence[Sequence[int]],
    steps: int,
) -> tuple[list[list[int]], dict[str, Agreement]]:
    """Decode every prompt with ``reference`` and compare each candidate, teacher-forced."""
    tokens: list[list[int]] = []
    found: dict[str, list[PromptAgreement]] = {name: [] for name in candidates}
    for index, prompt in enumerate(prompts):
        live = dict(candidates)
        reference.reset()
        for session in live.values():
            session.reset()
        divergent: dict[str, int | None] = {name: None for name in live}
        worst: dict[str, float] = {name: 0.0 for name in live}
        broken: dict[str, str] = {}
        generated: list[int] = []
        token = prompt[0]
        for position in range(len(prompt) + steps - 1):
            expected = reference.step(token, position)
            generating = position >= len(prompt) - 1
            for name in list(live):
                try:
                    logits = live[name].step(token, position)
                except NonFiniteError as error:
                    broken[name] = str(error)
                    divergent[name] = max(0, position - len(prompt) + 1)
                    del live[name]
                    continue
                worst[name] = max(worst[name], float(np.max(np.abs(logits - expected))))
                if generating and divergent[name] is None:
                    if int(np.argmax(logits)) != int(np.argmax(expected)):
                        divergent[name] = position - len(prompt) + 1
            if generating:
                generated.append(int(np.argmax(expected)))
                token = generated[-1]
            else:
                token = prompt[position + 1]
        tokens.append(generated)
        for name in candidates:
            found[name].append(
                PromptAgreement(
                    index=index,
                    identical=divergent[name] is None and name not in broken,
                    first_divergent_step=divergent[name],
                    max_abs_logit_diff=worst[name],
                    non_finite=broken.get(name),
                )
            )
    return tokens, {name: Agreement(candidate=name, prompts=rows) for name, rows in found.items()}


def repair_mlpackage(
    source: Path | str,
    target: Path | str,
    prompts: Sequence[Sequence[int]],
    steps: int,
    log: Callable[[str], None] | None = None,
) -> RepairReport:
    """Write ``source`` with the repairs that proved themselves to ``target``."""
    source, target = Path(source), Path(target)
    if source.resolve() == target.resolve():
        raise MilError("the output package must differ from the input package")
    if not prompts or steps < 1:
        raise MilError("the proof needs at least one prompt and one step")
    say = log or (lambda _message: None)
    reference_program = load_package(source).program
    widen_program(reference_program)
    reference = _session(reference_program, f"{source} (fp32)")
    context, longest = reference.interface.context, max(len(prompt) for prompt in prompts)
    if longest + steps > context:
        raise MilError(
            f"a prompt of {longest} tokens and {steps} steps need {longest + steps} positions; "
            f"the package's context is {context}"
        )

    original = load_package(source)
    norm_package = load_package(source)
    norms = repair_norms(norm_package.program)
    rewritten = [norm for norm in norms if norm.status == "rewritten"]
    both_package = load_package(source)
    repair_norms(both_package.program)
    fold = fold_program(both_package.program)

    programs: dict[str, Any] = {"original": original.program}
    if rewritten:
        programs["norms"] = norm_package.program
    if fold.rewritten:
        if rewritten:
            programs["norms+fold"] = both_package.program
        else:
            programs["fold"] = both_package.program
    say(f"proving {len(programs) - 1} candidate(s) on {len(prompts)} prompts x {steps} steps")
    sessions = {name: _session(program, f"{source} ({name})") for name, program in programs.items()}
    reference_tokens, agreements = prove(reference, sessions, prompts, steps)

    applied: list[str] = []
    refused: dict[str, str] = {}
    base = agreements["original"]
    if rewritten:
        if agreements["norms"].improves_on(base):
            applied.append("norms")
            base = agreements["norms"]
        else:
            refused["norms"] = "does not improve agreement with the fp32 reference"
    if fold.rewritten:
        name = "norms+fold" if rewritten else "fold"
        if "norms" not in applied and rewritten:
            refused["fold"] = "proven only together with the norm repair, which was refused"
        elif agreements[name].no_worse_than(base):
            applied.append("fold")
        else:
            refused["fold"] = "makes agreement with the fp32 reference worse"

    chosen = {
        (): None,
        ("norms",): norm_package,
        ("fold",): both_package,
        ("norms", "fold"): both_package,
    }[tuple(applied)]
    if chosen is None:
        copy_package(source, target)
    else:
        summary = f"{len(rewritten)} norms made overflow-safe" if "norms" in applied else ""
        if "fold" in applied:
            summary += ("; " if summary else "") + f"{fold.rewritten} attention patterns folded"
        save_package(chosen.program, target, chosen.spec, {REPAIR_METADATA_KEY: summary})
    return RepairReport(
        source=str(source),
        target=str(target),
        prompts=len(prompts),
        steps=steps,
        norms=norms,
        fold=fold if fold.found else None,
        original=agreements["original"],
        candidates=[agreements[name] for name in programs if name != "original"],
        applied=applied,
        refused=refused,
        reference_tokens=reference_tokens,
    )


def render(report: RepairReport) -> str:
    lines = [f"repair {report.source} -> {report.target}"]
    rewritten = [norm for norm in report.norms if norm.status == "rewritten"]
    left = [norm for norm in report.norms if norm.status != "rewritten"]
    lines.append(
        f"  norms          {len(report.norms)} found, {len(rewritten)} rewritten overflow-safe, "
        f"{len(left)} left"
    )
    kinds = sorted({norm.kind for norm in rewritten})
    if rewritten:
        labels = ", ".join(norm.label for norm in rewritten[:4])
        more = f" and {len(rewritten) - 4} more" if len(rewritten) > 4 else ""
        lines.append(f"    rewritten    ({'/'.join(kinds)}) {labels}{more}")
    for norm in left:
        lines.append(f"    left         {norm.label}: {norm.reason}")
    if report.fold is not None:
        lines.append(
            f"  fold           {report.fold.found} attention patterns, "
            f"{report.fold.rewritten} foldable, {report.fold.refused} refused"
        )
    lines.append(
        f"  proof          against the package's own fp32 run, {report.prompts} prompts x "
        f"{report.steps} greedy steps"
    )
    for agreement in [report.original, *report.candidates]:
        lines.append(f"    {agreement.candidate:12} {agreement.summary()}")
    lines.append(f"  applied        {', '.join(report.applied) or 'nothing'}")
    for name, why in report.refused.items():
        lines.append(f"  not applied    {name}: {why}")
    return "\n".join(lines)
