"""The doctor's one pass against the separate passes it replaced: CPU seconds, same findings.

    python -m bench.doctor_passes                           # SmolLM2 recipe package, 3 x 8
    python -m bench.doctor_passes --package tiny --prompts 3 --steps 8

The separate passes are what ``doctor()`` ran before: the analysis, the waste list (its own load),
``measure_headroom`` (a peak-recording fp32 run, then an fp16 run for the first non-finite op,
each loading the package) and ``repair_mlpackage`` (an fp32 run teaching every candidate, four
more loads), and the analysis of the output. The one pass is ``doctor()``: the package parsed
once, the peak-recording fp32 run teaching the candidates, the first non-finite op taken from
the original candidate. Both run in this process, one after the other; printed: CPU and wall
seconds of each, the load average around them, and whether the hazards, the first non-finite
op, the reference tokens and the agreement are the same.

The packages: ``tiny``, a 3-layer Llama whose residual carries a massive channel
(decodebench/formats/coreml/recipe.py, converted once into a temporary folder), or ``smollm2``,
SmolLM2-135M-Instruct by the Apple recipe (cached under ~/.cache/decodebench/recipe), its chat
prompts tokenized by its own tokenizer.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from decodebench.analysis.analyze import analyze_mlpackage
from decodebench.doctor.doctor import doctor
from decodebench.doctor.headroom import measure_headroom
from decodebench.doctor.repair import repair_mlpackage
from decodebench.doctor.waste import find_waste
from decodebench.formats.coreml.program import quiet_coremltools

TINY_PROMPTS = [[1, 2, 3, 4], [9, 8, 7], [100, 5], [3, 30, 60, 90, 120], [7], [11, 12]]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--package", choices=("smollm2", "tiny"), default="smollm2")
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument(
        "--per-step",
        action="store_true",
        help="also CPU ms per decode step of each decoder the pass runs (and transformers fp32)",
    )
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="doctor-passes-"))
    with quiet_coremltools():
        if args.package == "tiny":
            from decodebench.formats.coreml.recipe import (
                convert_model,
                tiny_llama_with_massive_channel,
            )

            package = work / "tiny.mlpackage"
            convert_model(tiny_llama_with_massive_channel(), package, "state", 64)
            prompts = TINY_PROMPTS[: args.prompts]
        else:
            from decodebench.building.realmodels import fetch_model
            from decodebench.formats.coreml.recipe import recipe_package
            from decodebench.prompts import chat_prompts, chat_token_ids

            weights = fetch_model("smollm2-135m")
            package = recipe_package(weights, "state", 256)
            prompts = chat_token_ids(weights, [p.text for p in chat_prompts(args.prompts)])

        load_before = os.getloadavg()[0]
        cpu, wall = time.process_time(), time.perf_counter()
        analysis = analyze_mlpackage(package)
        find_waste(package, analysis)
        headroom = measure_headroom(package, prompts, args.steps)
        repair = repair_mlpackage(package, work / "separate.mlpackage", prompts, args.steps)
        analyze_mlpackage(work / "separate.mlpackage")
        separate = time.process_time() - cpu, time.perf_counter() - wall

        cpu, wall = time.process_time(), time.perf_counter()
        report = doctor(package, work / "one.mlpackage", prompts, args.steps)
        one = time.process_time() - cpu, time.perf_counter() - wall
        load_after = os.getloadavg()[0]

    def rows(agreements: list) -> list:
        return [
            (a.candidate, [(p.identical, p.first_divergent_step, p.non_finite) for p in a.prompts])
            for a in agreements
        ]

    same = {
        "hazards": report.headroom.hazards == headroom.hazards,
        "first non-finite": report.headroom.first_non_finite == headroom.first_non_finite,
        "reference tokens": report.repair.reference_tokens == headroom.reference_tokens,
        "agreement": rows([report.repair.original, *report.repair.candidates])
        == rows([repair.original, *repair.candidates]),
        "applied": report.repair.applied == repair.applied,
    }
    positions = sum(len(prompt) + args.steps - 1 for prompt in prompts)
    print(f"{args.package}: {len(prompts)} prompts x {args.steps} steps ({positions} positions)")
    print(f"  separate passes  {separate[0]:7.1f} s CPU  {separate[1]:7.1f} s wall")
    print(f"  one pass         {one[0]:7.1f} s CPU  {one[1]:7.1f} s wall")
    print(f"  CPU saved        {1 - one[0] / separate[0]:.0%}")
    print(
        "  same findings    " + ", ".join(f"{k}: {'yes' if v else 'NO'}" for k, v in same.items())
    )
    first = report.headroom.first_non_finite
    print(f"  first overflow   {first.label if first else 'none'}")
    print(f"  result           {report.repair.result.summary()}")
    print(f"  load average     {load_before:.2f} -> {load_after:.2f} (1 min)")
    if args.per_step:
        with quiet_coremltools():
            per_step(package, weights if args.package == "smollm2" else None)
    return 0 if all(same.values()) else 1


def per_step(package: Path, weights: Path | None, steps: int = 8) -> None:
    """CPU ms per decode step: what one position of the pass costs, decoder by decoder."""
    import torch

    from decodebench.doctor.checkpoint import load_checkpoint
    from decodebench.doctor.headroom import PeakRecorder
    from decodebench.formats.coreml.cache_io import decode_session
    from decodebench.formats.coreml.interpreter import Interpreter
    from decodebench.formats.coreml.norm_repair import repair_norms
    from decodebench.formats.coreml.program import load_package
    from decodebench.formats.coreml.widen import widen_program

    def timed(label: str, session: object) -> None:
        session.reset()  # type: ignore[attr-defined]
        session.step(1, 0)  # type: ignore[attr-defined]  # the first step compiles
        cpu = time.process_time()
        for position in range(1, steps + 1):
            session.step(position + 3, position)  # type: ignore[attr-defined]
        print(f"  {label:34} {(time.process_time() - cpu) / steps * 1000:6.0f} ms CPU per step")

    print(f"per decode step ({steps} steps each, load average {os.getloadavg()[0]:.2f}):")
    wide = load_package(package).program
    widen_program(wide)
    timed("fp32, compiled (repair's reference)", decode_session(Interpreter(wide)))
    wide = load_package(package).program
    widen_program(wide)
    timed("fp32, recording peaks (the doctor's)", decode_session(PeakRecorder(wide)))
    repaired = load_package(package).program
    repair_norms(repaired)
    timed("fp16, norms repaired", decode_session(Interpreter(repaired)))
    if weights is not None:
        session = load_checkpoint(weights, decode_session(Interpreter(repaired)).interface.vocab,
                                  None, None)  # fmt: skip
        timed("transformers fp32, one thread", session)
        # The same steps on torch's own pool (two threads here), beside nothing else of ours.
        torch.set_num_threads(2)
        cache, cpu = None, time.process_time()
        with torch.no_grad():
            for position in range(steps):
                output = session.model(
                    torch.tensor([[position + 3]]), use_cache=True, **{session.cache_name: cache}
                )
                cache = output[session.cache_name]
        print(
            f"  {'transformers fp32, two threads':34} "
            f"{(time.process_time() - cpu) / steps * 1000:6.0f} ms CPU per step"
        )


if __name__ == "__main__":
    raise SystemExit(main())
