"""The doctor: one package diagnosed, repaired, proven and measured, as one report.

``doctor(source, target, prompts, steps)`` runs, in order:

1. the graph analysis of ``source`` (bytes per token, predicted tok/s per device class);
2. the avoidable bytes it recognises, each with its fix (:mod:`decodebench.mil.waste`);
3. the fp16 headroom by layer and role and the first op that produces a non-finite value
   (:mod:`decodebench.mil.headroom`);
4. every safe repair, proven against the package's own fp32 run on the prompts, kept only if it
   proves itself (:mod:`decodebench.mil.repair`), written to ``target``;
5. the analysis of ``target``.

``log`` receives one line per stage, for progress.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

from decodebench.analysis.analyze import analyze_mlpackage
from decodebench.contracts.doctor import DoctorReport
from decodebench.mil.headroom import measure_headroom
from decodebench.mil.repair import repair_mlpackage
from decodebench.mil.waste import find_waste


def doctor(
    source: Path | str,
    target: Path | str,
    prompts: Sequence[Sequence[int]],
    steps: int,
    log: Callable[[str], None] | None = None,
) -> DoctorReport:
    say = log or (lambda _message: None)
    started = time.monotonic()
    say("analysing the graph")
    analysis = analyze_mlpackage(source)
    waste = find_waste(source, analysis)
    say(f"measuring fp16 headroom on {len(prompts)} prompts x {steps} steps")
    headroom = measure_headroom(source, prompts, steps)
    say("repairing and proving")
    repair = repair_mlpackage(source, target, prompts, steps, log=say)
    repaired_analysis = analyze_mlpackage(target)
    return DoctorReport(
        package=str(source),
        prompts=len(prompts),
        steps=steps,
        analysis=analysis,
        headroom=headroom,
        waste=waste,
        repair=repair,
        repaired_analysis=repaired_analysis,
        seconds=round(time.monotonic() - started, 3),
    )
