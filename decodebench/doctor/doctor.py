"""The doctor: one package diagnosed, repaired, proven and measured, as one report.

``doctor(source, target, prompts, steps)`` runs, in order:

1. the graph analysis of ``source`` (bytes per token, predicted tok/s per device class);
2. the avoidable bytes it recognises, each with its fix (:mod:`decodebench.doctor.waste`);
3. one decoding pass over the prompts (:class:`decodebench.doctor.repair.Cure`): the package's
   own fp32 run records every op's largest |value| (the fp16 headroom by layer and role,
   :mod:`decodebench.doctor.headroom`) and teaches every candidate (the original fp16 program,
   whose first non-finite op is the package's first overflow, and each repair); with
   ``weights`` (a checkpoint folder) transformers fp32 is stepped in the same loop;
4. every repair that proved itself, written to ``target``;
5. the analysis of ``target``.

``log`` receives one line per stage and per prompt, for progress.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

from decodebench.analysis.analyze import analyze_mlpackage
from decodebench.contracts.doctor import DoctorReport
from decodebench.doctor.headroom import DEFAULT_MARGIN
from decodebench.doctor.repair import Cure
from decodebench.doctor.waste import find_waste


def doctor(
    source: Path | str,
    target: Path | str,
    prompts: Sequence[Sequence[int]],
    steps: int,
    log: Callable[[str], None] | None = None,
    *,
    weights: Path | str | None = None,
    margin: float = DEFAULT_MARGIN,
) -> DoctorReport:
    """Diagnose, repair and prove ``source``; the repaired package is written to ``target``.

    ``weights``: a checkpoint folder (config and safetensors) whose transformers fp32 tokens the
    package's fp32 run and the repaired package are compared with.
    """
    say = log or (lambda _message: None)
    started = time.monotonic()
    analysis = analyze_mlpackage(source)
    # Everything the package, the prompts or the checkpoint can get wrong is refused here.
    cure = Cure(source, target, prompts, steps, record_peaks=True, weights=weights, margin=margin)
    say(f"analysed the graph: {analysis.bytes_per_token.total / 2**20:,.1f} MiB per token")
    waste = find_waste(source, analysis)
    cured = cure.run(say)
    assert cured.headroom is not None
    repaired_analysis = analyze_mlpackage(target)
    return DoctorReport(
        package=str(source),
        prompts=len(prompts),
        steps=steps,
        analysis=analysis,
        headroom=cured.headroom,
        waste=waste,
        repair=cured.repair,
        repaired_analysis=repaired_analysis,
        checkpoint=cured.checkpoint,
        seconds=round(time.monotonic() - started, 3),
    )
