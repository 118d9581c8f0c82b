"""fp16 headroom by layer and role: how close each op comes to fp16's largest value, 65,504.

The package runs as its own fp32 reference (:mod:`decodebench.formats.coreml.widen`) over the prompts, each
prompt followed by greedy steps; for every op the largest |value| it produces is kept per prompt.
An op whose largest value passes 65,504 overflows in fp16; one within ``margin`` (4x) of it is
close. Each hazard is named by layer and role (:mod:`decodebench.formats.coreml.anatomy`), e.g.
``layer 2 · input norm · square: 84,390 > 65,504 on 30 of 30 prompts``.

The fp16 program itself is run too, and the first op that produces a non-finite value in it is
named the same way. The fp32 run's greedy tokens are returned: they are what a repair is proven
against (:mod:`decodebench.doctor.repair`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from decodebench.contracts.doctor import FP16_MAX, Hazard, HeadroomReport, NonFinite
from decodebench.formats.coreml.anatomy import Place, describe
from decodebench.formats.coreml.cache_io import Session, decode_session
from decodebench.formats.coreml.functions import decode_function, prefill_function
from decodebench.formats.coreml.interpreter import Interpreter, NonFiniteError
from decodebench.formats.coreml.program import load_package
from decodebench.formats.coreml.widen import widen_program

DEFAULT_MARGIN = 4.0
CLOSE_SHOWN = 10


class PeakRecorder(Interpreter):
    """An interpreter that keeps, per op, the largest finite |value| of its float outputs.

    It takes the interpreter's per-op path (``_execute``), so it is slower than the plain one;
    it never raises on non-finite values (it is meant for the fp32 run).
    """

    def __init__(self, program: Any, function: str = "main") -> None:
        super().__init__(program, function, check_finite=False)
        self.peaks: dict[str, float] = {}

    def _execute(
        self, op: Any, env: Mapping[int, Any], states: dict[str, np.ndarray]
    ) -> Sequence[Any]:
        results = super()._execute(op, env, states)
        if op.op_type == "const" or op.op_type.startswith("constexpr_"):
            return results
        peak = self.peaks.get(op.name, 0.0)
        for value in results:
            array = np.asarray(value)
            if array.dtype.kind != "f" or array.size == 0:
                continue
            finite = np.isfinite(array)
            magnitudes = np.abs(array if finite.all() else array[finite])
            if magnitudes.size:
                peak = max(peak, float(magnitudes.max()))
        self.peaks[op.name] = peak
        return results


def _greedy(session: Session, prompt: Sequence[int], steps: int) -> list[int]:
    session.reset()
    logits = session.prefill(prompt)[-1]
    tokens = [int(np.argmax(logits))]
    for step in range(steps - 1):
        tokens.append(session.next_token(tokens[-1], len(prompt) + step))
    return tokens


def _place(places: Mapping[str, Place], op_name: str) -> Place:
    return places.get(op_name) or Place(layer=None, section="program", role=op_name)


def find_hazards(
    per_prompt: Sequence[Mapping[str, float]],
    places: Mapping[str, Place],
    types: Mapping[str, str],
    margin: float = DEFAULT_MARGIN,
    prefill: str | None = None,
) -> list[Hazard]:
    """The ops whose largest |value| (per prompt, in program order) comes within ``margin`` of
    fp16's largest value or passes it, named by layer and role.

    ``prefill``: the peaks are that prefill function's ops (its name starts each label).
    """
    threshold = FP16_MAX / margin
    hazards = []
    names = dict.fromkeys(name for found in per_prompt for name in found)
    for name in names:
        peaks = [found.get(name, 0.0) for found in per_prompt]
        if max(peaks) <= threshold:
            continue
        place = _place(places, name)
        hazards.append(
            Hazard(
                op=name,
                op_type=types.get(name, "?"),
                label=place.label if prefill is None else f"{prefill} · {place.label}",
                layer=place.layer,
                role=place.role,
                peak=max(peaks),
                overflow_prompts=sum(peak > FP16_MAX for peak in peaks),
                close_prompts=sum(peak > threshold for peak in peaks),
                prompts=len(per_prompt),
                function=prefill,
            )
        )
    return hazards


def name_non_finite(
    error: NonFiniteError,
    places: Mapping[str, Place],
    prompt: int,
    prefill: str | None = None,
) -> NonFinite:
    """A non-finite value the fp16 program produced, named by layer and role.

    ``prefill``: the name of the program's prefill function when ``error`` came from it
    (``places`` are then that function's); the label starts with it.
    """
    place = _place(places, error.op_name)
    return NonFinite(
        op=error.op_name,
        op_type=error.op_type,
        label=place.label if prefill is None else f"{prefill} · {place.label}",
        prompt=prompt,
        message=str(error),
        function=prefill,
    )


def error_label(
    error: NonFiniteError, places: Mapping[str, Mapping[str, Place]], decode: str
) -> tuple[str, str | None]:
    """(label, prefill function or None) of a non-finite value, from ``places`` by function."""
    function = error.function if error.function is not None and error.function in places else decode
    place = _place(places.get(function, {}), error.op_name)
    if function == decode:
        return place.label, None
    return f"{function} · {place.label}", function


def op_types(function: Any) -> dict[str, str]:
    return {op.name: op.op_type for op in function.operations}


def measure_headroom(
    path: Path | str,
    prompts: Sequence[Sequence[int]],
    steps: int,
    margin: float = DEFAULT_MARGIN,
) -> HeadroomReport:
    """The fp32 run's peaks and the fp16 run's first non-finite op, over ``prompts``, as two
    runs of their own (the doctor takes both from its one pass, :mod:`decodebench.doctor.repair`)."""
    loaded = load_package(path)
    wide = loaded.program
    widen_program(wide)
    decode = decode_function(loaded.spec, wide)
    prefill = prefill_function(wide, decode)
    recorder = PeakRecorder(wide, decode)
    places = describe(recorder.function)
    prefill_recorder = None if prefill is None else PeakRecorder(wide, prefill)
    session = decode_session(recorder, str(path), prefill=prefill_recorder)
    per_prompt: list[dict[str, float]] = []
    per_prompt_prefill: list[dict[str, float]] = []
    reference: list[list[int]] = []
    for prompt in prompts:
        recorder.peaks = {}
        if prefill_recorder is not None:
            prefill_recorder.peaks = {}
        reference.append(_greedy(session, prompt, steps))
        per_prompt.append(recorder.peaks)
        if prefill_recorder is not None:
            per_prompt_prefill.append(prefill_recorder.peaks)
    hazards = find_hazards(per_prompt, places, op_types(recorder.function), margin)
    if prefill_recorder is not None:
        function = prefill_recorder.function
        hazards += find_hazards(
            per_prompt_prefill, describe(function), op_types(function), margin, prefill
        )
    return HeadroomReport(
        package=str(path),
        prompts=len(prompts),
        steps=steps,
        margin=margin,
        hazards=hazards,
        first_non_finite=first_non_finite(path, prompts, steps),
        reference_tokens=reference,
        decode_function=decode,
        prefill_function=prefill,
    )


def first_non_finite(
    path: Path | str, prompts: Sequence[Sequence[int]], steps: int
) -> NonFinite | None:
    """The first op producing a non-finite value when the fp16 program decodes the prompts."""
    loaded = load_package(path)
    program = loaded.program
    decode = decode_function(loaded.spec, program)
    prefill = prefill_function(program, decode)
    interpreter = Interpreter(program, decode)
    prefill_interpreter = None if prefill is None else Interpreter(program, prefill)
    session = decode_session(interpreter, str(path), prefill=prefill_interpreter)
    places = {name: describe(function) for name, function in program.functions.items()}
    for index, prompt in enumerate(prompts):
        try:
            _greedy(session, prompt, steps)
        except NonFiniteError as error:
            _label, function = error_label(error, places, decode)
            return name_non_finite(error, places[function or decode], index, function)
    return None


def overflowing_layers(report: HeadroomReport) -> str:
    """``2-10, 12-29 and the head``: where an op overflows."""
    layers = sorted({h.layer for h in report.overflows if h.layer is not None})
    runs: list[str] = []
    for layer in layers:
        if runs and runs[-1].split("-")[-1] == str(layer - 1):
            runs[-1] = f"{runs[-1].split('-')[0]}-{layer}"
        else:
            runs.append(str(layer))
    sections = sorted(
        {h.label.split(" · ")[h.function is not None] for h in report.overflows if h.layer is None}
    )
    parts = [f"layers {', '.join(runs)}" if runs else "", *(f"the {name}" for name in sections)]
    parts = [part for part in parts if part]
    return " and ".join(parts) if parts else "none"


def render(report: HeadroomReport, overflows_shown: int | None = None) -> list[str]:
    """The report as lines; ``overflows_shown``: at most that many overflowing ops listed."""
    lines = [
        f"fp16 headroom of {report.package}: {report.prompts} prompts x {report.steps} steps, "
        f"its own fp32 run"
    ]
    if report.prefill_function is not None:
        lines.append(
            f"  functions: each prompt through {report.prefill_function!r}, tokens through "
            f"{report.decode_function!r} (the ops of both are watched)"
        )
    if report.first_non_finite is not None:
        found = report.first_non_finite
        lines.append(
            f"  first non-finite in fp16: {found.label} ({found.op_type} '{found.op}', "
            f"prompt {found.prompt})"
        )
    else:
        lines.append("  no non-finite value in the fp16 run")
    overflows = report.overflows
    close = [hazard for hazard in report.hazards if not hazard.overflows]
    lines.append(
        f"  hazards: {len(overflows)} ops overflow, {len(close)} within {report.margin:g}x"
    )
    if overflows:
        lines.append(f"  overflowing: {overflowing_layers(report)}")
    listed = overflows if overflows_shown is None else overflows[:overflows_shown]
    for hazard in listed:  # in program order
        lines.append(f"  [OVERFLOW] {hazard.describe()}")
    if len(listed) < len(overflows):
        lines.append(f"  ... and {len(overflows) - len(listed)} more overflowing ops")
    for hazard in sorted(close, key=lambda item: -item.peak)[:CLOSE_SHOWN]:
        lines.append(f"  [close]    {hazard.describe()}")
    if len(close) > CLOSE_SHOWN:
        lines.append(f"  ... and {len(close) - CLOSE_SHOWN} more within {report.margin:g}x")
    return lines
