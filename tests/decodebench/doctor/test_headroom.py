"""fp16 headroom by layer and role, from the package's own fp32 run, and the first overflow."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow  # the fixtures convert models

PROMPTS = [[1, 2, 3, 4], [9, 8, 7]]


def test_the_overflowing_norms_are_named_by_layer_and_role(massive_llama_package):
    from decodebench.contracts.doctor import FP16_MAX
    from decodebench.doctor.headroom import measure_headroom

    report = measure_headroom(massive_llama_package, PROMPTS, steps=3)

    assert report.first_non_finite is not None
    assert report.first_non_finite.label == "layer 1 · input norm · square"
    overflowing = {hazard.label for hazard in report.overflows}
    assert overflowing == {
        "layer 1 · input norm · square",
        "layer 1 · post-attention norm · square",
        "layer 2 · input norm · square",
        "layer 2 · post-attention norm · square",
        "head · final norm · square",
    }
    for hazard in report.overflows:
        assert hazard.peak > FP16_MAX
        assert hazard.overflow_prompts == hazard.prompts == len(PROMPTS)
        assert hazard.describe().startswith(f"{hazard.label}: ")
    # Layer 0's input norm sees ordinary embeddings: no hazard there.
    assert not any(hazard.layer == 0 and "norm" in hazard.role for hazard in report.hazards)
    assert [len(tokens) for tokens in report.reference_tokens] == [3, 3]


def test_the_fp32_reference_is_the_same_program_without_fp16_rounding(massive_llama_package):
    import numpy as np

    from decodebench.formats.coreml.interpreter import Interpreter
    from decodebench.formats.coreml.program import load_package
    from decodebench.formats.coreml.widen import widen_program

    program = load_package(massive_llama_package).program
    assert widen_program(program) > 0
    interpreter = Interpreter(program)
    assert {spec.dtype for spec in interpreter.states.values()} == {np.dtype(np.float32)}
    feed = {
        "input_ids": np.array([[3]], np.int32),
        "position": np.array([0], np.int32),
        "causal_mask": np.where(np.arange(64) < 1, 0.0, -np.inf).reshape(1, 1, 1, 64),
    }
    logits = interpreter.run(feed)["logits"]
    assert logits.dtype == np.float32 and np.isfinite(logits).all()
