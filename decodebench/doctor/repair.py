"""Repair a saved ``.mlpackage``: apply every safe repair, prove each on prompts, keep what helps.

Repairs, in order: the overflow-safe norm rewrite (:mod:`decodebench.formats.coreml.norm_repair`) and the
GQA fold (:mod:`decodebench.formats.coreml.fold`). Each candidate program is proven against the package's
own fp32 run (:mod:`decodebench.formats.coreml.widen`) on the prompts: both decode each prompt then
``steps`` tokens, the candidate teacher-forced with the reference's tokens, so every step
compares logits for the same context (:mod:`decodebench.doctor.proof`). Per candidate: the share of prompts whose greedy tokens
are all the reference's, the first divergent step of each other prompt (with the reference's
top-1 minus top-2 logit there: a flip at a near tie is rounding), the largest logit difference,
and the prompts where the candidate produced a non-finite value.

A norm repair is kept only if it improves agreement (more prompts with identical tokens, or as
many and fewer with a non-finite value): a smaller logit error alone does not pay for its ops. The
fold, a speed repair that is exact, is kept if it does not make agreement worse. The output
package holds what was kept; with nothing kept it is a byte copy of the input.

:class:`Cure` is that proof as the one pass of the doctor: the package is parsed once; the fp32
reference can record every op's largest |value| as it decodes (the fp16 headroom,
:mod:`decodebench.doctor.headroom`), the original fp16 candidate's first non-finite op is the
package's first overflow, and a checkpoint's transformers fp32 (:mod:`decodebench.doctor.checkpoint`)
is stepped in the same loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from decodebench.contracts.doctor import (
    Agreement,
    CheckpointAgreement,
    HeadroomReport,
    RepairReport,
)
from decodebench.doctor.checkpoint import TransformersSession, load_checkpoint
from decodebench.doctor.headroom import (
    DEFAULT_MARGIN,
    PeakRecorder,
    error_label,
    find_hazards,
    name_non_finite,
    op_types,
)
from decodebench.doctor.proof import REFERENCE, Proof, Stepper, prove
from decodebench.formats.coreml.anatomy import Place, describe, dimensions
from decodebench.formats.coreml.cache_io import Session, decode_session
from decodebench.formats.coreml.fold import fold_program
from decodebench.formats.coreml.fold_package import copy_package
from decodebench.formats.coreml.functions import decode_function, prefill_function
from decodebench.formats.coreml.interpreter import Interpreter, NonFiniteError
from decodebench.formats.coreml.norm_repair import repair_norms
from decodebench.formats.coreml.program import LoadedPackage, MilError, load_packages, save_package
from decodebench.formats.coreml.widen import widen_program

REPAIR_METADATA_KEY = "decodebench.repair"
TRANSFORMERS = "transformers"  # the checkpoint's transformers fp32, when there is one


def _session(program: Any, label: str, decode: str = "main", prefill: str | None = None) -> Session:
    """The decode loop of ``program``'s function ``decode``, its prompt through ``prefill``."""
    prefill_interpreter = None if prefill is None else Interpreter(program, prefill)
    return decode_session(Interpreter(program, decode), label, prefill=prefill_interpreter)


@dataclass
class Cured:
    repair: RepairReport
    headroom: HeadroomReport | None = None
    checkpoint: CheckpointAgreement | None = None
    seconds: dict[str, float] = field(default_factory=dict)


class Cure:
    """A package's repair candidates, proven in one pass against its own fp32 run.

    The package is parsed once (four programs from its spec: the fp32 reference, the original,
    the norm repair, the norm repair with the fold). Everything a prompt or a checkpoint could
    get wrong is refused here, before any decoding and before anything is written.
    """

    def __init__(
        self,
        source: Path | str,
        target: Path | str,
        prompts: Sequence[Sequence[int]],
        steps: int,
        *,
        record_peaks: bool = False,
        weights: Path | str | None = None,
        margin: float = DEFAULT_MARGIN,
    ) -> None:
        self.source, self.target = Path(source), Path(target)
        if self.source.resolve() == self.target.resolve():
            raise MilError("the output package must differ from the input package")
        if not prompts or steps < 1:
            raise MilError("the proof needs at least one prompt and one step")
        if any(not prompt for prompt in prompts):
            raise MilError("every prompt needs at least one token")
        self.prompts = [list(prompt) for prompt in prompts]
        self.steps, self.margin = steps, margin
        reference, original, norms, both = load_packages(self.source, 4)
        self.original = original
        # The function a token decodes through, and the one each prompt goes through first.
        self.decode = decode_function(original.spec, original.program)
        self.prefill = prefill_function(original.program, self.decode)
        widen_program(reference.program)
        self.wide = reference.program
        self.recorder = PeakRecorder(reference.program, self.decode) if record_peaks else None
        interpreter = self.recorder or Interpreter(reference.program, self.decode)
        self.prefill_recorder: PeakRecorder | None = None
        prefill: Interpreter | None = None
        if self.prefill is not None:
            if record_peaks:
                prefill = self.prefill_recorder = PeakRecorder(reference.program, self.prefill)
            else:
                prefill = Interpreter(reference.program, self.prefill)
        self.reference = decode_session(interpreter, f"{self.source} (fp32)", prefill=prefill)
        interface = self.reference.interface
        longest = max(len(prompt) for prompt in self.prompts)
        if longest + steps > interface.context:
            raise MilError(
                f"a prompt of {longest} tokens and {steps} steps need {longest + steps} "
                f"positions; the package's context is {interface.context}"
            )
        function = original.program.functions[self.decode]
        self.places: dict[str, Place] = describe(function)
        self.checkpoint: TransformersSession | None = None
        self.weights = None if weights is None else str(weights)
        if weights is not None:
            layers, hidden = dimensions(function, self.places)
            self.checkpoint = load_checkpoint(weights, interface.vocab, layers, hidden)
        ids = [token for prompt in self.prompts for token in prompt]
        if min(ids) < 0 or max(ids) >= interface.vocab:
            raise MilError(
                f"the prompts hold token ids {min(ids)}..{max(ids)}; the package's vocabulary "
                f"is 0..{interface.vocab - 1} (a tokenizer of another model?)"
            )

        self.norms = repair_norms(norms.program)
        self.rewritten = [norm for norm in self.norms if norm.status == "rewritten"]
        repair_norms(both.program)
        self.fold = fold_program(both.program)
        self.packages: dict[str, LoadedPackage] = {"original": original}
        if self.rewritten:
            self.packages["norms"] = norms
        if self.fold.rewritten:
            self.packages["norms+fold" if self.rewritten else "fold"] = both
        # Every candidate's ops by function (the original's first), to name a non-finite value
        # where it happened, in the decode function or the prefill one.
        self.places_by_function: dict[str, dict[str, Place]] = {}
        for package in reversed(self.packages.values()):
            for function_name, each in package.program.functions.items():
                found = (
                    self.places if package is original and function_name == self.decode else None
                )
                self.places_by_function.setdefault(function_name, {}).update(
                    found or describe(each)
                )

    def explain(self, error: NonFiniteError) -> str:
        """A candidate's non-finite value, named by layer and role (and function, if prefill)."""
        label, _function = error_label(error, self.places_by_function, self.decode)
        return f"{label}: {error}"

    def run(self, log: Callable[[str], None] | None = None) -> Cured:
        """Prove every candidate in one pass, keep what proves itself, write the target."""
        say = log or (lambda _message: None)
        sessions: dict[str, Stepper] = {
            name: _session(package.program, f"{self.source} ({name})", self.decode, self.prefill)
            for name, package in self.packages.items()
        }
        pairs: list[tuple[str, str]] = []
        if self.checkpoint is not None:
            sessions[TRANSFORMERS] = self.checkpoint
            pairs = [(TRANSFORMERS, REFERENCE)] + [(TRANSFORMERS, name) for name in self.packages]
        per_prompt: list[dict[str, float]] = []
        per_prompt_prefill: list[dict[str, float]] = []
        started = last = time.monotonic()

        def done(index: int) -> None:
            nonlocal last
            if self.recorder is not None:
                per_prompt.append(self.recorder.peaks)
                self.recorder.peaks = {}
            if self.prefill_recorder is not None:
                per_prompt_prefill.append(self.prefill_recorder.peaks)
                self.prefill_recorder.peaks = {}
            now = time.monotonic()
            positions = len(self.prompts[index]) + self.steps - 1
            say(
                f"prompt {index + 1}/{len(self.prompts)}: {positions} positions, "
                f"{now - last:.1f} s ({now - started:.0f} s so far)"
            )
            last = now

        say(
            f"proving {len(self.packages) - 1} candidate(s) against the package's fp32 run"
            + (" and transformers fp32" if self.checkpoint is not None else "")
            + f" on {len(self.prompts)} prompts x {self.steps} steps"
            + (
                f", each prompt through the {self.prefill!r} function"
                if self.prefill is not None
                else ""
            )
        )
        if self.recorder is not None:
            self.recorder.peaks = {}
        if self.prefill_recorder is not None:
            self.prefill_recorder.peaks = {}
        proof = prove(
            self.reference,
            sessions,
            self.prompts,
            self.steps,
            pairs=pairs,
            after_prompt=done,
            explain=self.explain,
        )
        repair = self._decide(proof)
        seconds = {"proof": round(time.monotonic() - started, 3)}
        headroom = self._headroom(proof, per_prompt, per_prompt_prefill)
        cured = Cured(repair=repair, headroom=headroom, seconds=seconds)
        if self.checkpoint is not None:
            cured.checkpoint = self._checkpoint(proof, repair, sessions, say)
        return cured

    def _headroom(
        self,
        proof: Proof,
        per_prompt: list[dict[str, float]],
        per_prompt_prefill: list[dict[str, float]],
    ) -> HeadroomReport | None:
        if self.recorder is None:
            return None
        hazards = find_hazards(
            per_prompt, self.places, op_types(self.recorder.function), self.margin
        )
        if self.prefill_recorder is not None and self.prefill is not None:
            function = self.prefill_recorder.function
            places = self.places_by_function[self.prefill]
            hazards += find_hazards(
                per_prompt_prefill, places, op_types(function), self.margin, self.prefill
            )
        broken = proof.errors["original"]
        first = min(broken, default=None)
        first_non_finite = None
        if first is not None:
            _label, function = error_label(broken[first], self.places_by_function, self.decode)
            places = self.places_by_function.get(function or self.decode, self.places)
            first_non_finite = name_non_finite(broken[first], places, first, function)
        return HeadroomReport(
            package=str(self.source),
            prompts=len(self.prompts),
            steps=self.steps,
            margin=self.margin,
            hazards=hazards,
            first_non_finite=first_non_finite,
            reference_tokens=proof.tokens,
            decode_function=self.decode,
            prefill_function=self.prefill,
        )

    def _decide(self, proof: Proof) -> RepairReport:
        agreements = proof.agreements
        applied: list[str] = []
        refused: dict[str, str] = {}
        base = agreements["original"]
        if self.rewritten:
            if agreements["norms"].improves_on(base):
                applied.append("norms")
                base = agreements["norms"]
            else:
                refused["norms"] = "does not improve agreement with the fp32 reference"
        if self.fold.rewritten:
            name = "norms+fold" if self.rewritten else "fold"
            if "norms" not in applied and self.rewritten:
                refused["fold"] = "proven only together with the norm repair, which was refused"
            elif agreements[name].no_worse_than(base):
                applied.append("fold")
            else:
                refused["fold"] = "makes agreement with the fp32 reference worse"
        chosen = self.packages.get(self.chosen(applied))
        if chosen is None or not applied:
            copy_package(self.source, self.target)
        else:
            summary = (
                f"{len(self.rewritten)} norms made overflow-safe" if "norms" in applied else ""
            )
            if "fold" in applied:
                summary += ("; " if summary else "") + (
                    f"{self.fold.rewritten} attention patterns folded"
                )
            save_package(chosen.program, self.target, chosen.spec, {REPAIR_METADATA_KEY: summary})
        return RepairReport(
            source=str(self.source),
            target=str(self.target),
            prompts=len(self.prompts),
            steps=self.steps,
            norms=self.norms,
            fold=self.fold if self.fold.found else None,
            original=agreements["original"],
            candidates=[agreements[name] for name in self.packages if name != "original"],
            applied=applied,
            refused=refused,
            reference_tokens=proof.tokens,
            decode_function=self.decode,
            prefill_function=self.prefill,
        )

    def chosen(self, applied: Sequence[str]) -> str:
        """The candidate the applied repairs make."""
        if not applied:
            return "original"
        if "fold" in applied and not self.rewritten:
            return "fold"
        return "+".join(applied)

    def _checkpoint(
        self,
        proof: Proof,
        repair: RepairReport,
        sessions: Mapping[str, Stepper],
        say: Callable[[str], None],
    ) -> CheckpointAgreement:
        """The package's fp32 run and the repaired candidate against transformers fp32.

        Where transformers' tokens are the reference's, the one pass compared both on
        transformers' own context. Where they are not, the pass's context left transformers'
        at its first divergence, so those prompts are decoded again with transformers as the
        teacher.
        """
        chosen = self.chosen(repair.applied)
        own = list(proof.pairs[(TRANSFORMERS, REFERENCE)].prompts)
        theirs = list(proof.pairs[(TRANSFORMERS, chosen)].prompts)
        again = [row.index for row in own if not row.identical]
        if again:
            say(f"transformers fp32 diverges from the package's fp32 run on prompts {again}")
            assert self.checkpoint is not None
            own_name = "package fp32"
            rerun = prove(
                self.checkpoint,
                {own_name: self.reference, chosen: sessions[chosen]},
                [self.prompts[index] for index in again],
                self.steps,
            )
            for position, index in enumerate(again):
                own[index] = (
                    rerun.agreements[own_name].prompts[position].model_copy(update={"index": index})
                )
                theirs[index] = (
                    rerun.agreements[chosen].prompts[position].model_copy(update={"index": index})
                )
        return CheckpointAgreement(
            weights=self.weights or "",
            reference=Agreement(candidate="package fp32", prompts=own),
            repaired=Agreement(candidate=chosen, prompts=theirs),
        )


def repair_mlpackage(
    source: Path | str,
    target: Path | str,
    prompts: Sequence[Sequence[int]],
    steps: int,
    log: Callable[[str], None] | None = None,
) -> RepairReport:
    """Write ``source`` with the repairs that proved themselves to ``target``."""
    return Cure(source, target, prompts, steps).run(log).repair
