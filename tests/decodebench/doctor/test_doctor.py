"""The doctor's one pass: what the separate passes found, from one decoding of the prompts."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow  # the fixtures convert models

PROMPTS = [[1, 2, 3, 4], [9, 8, 7], [100, 5]]


def test_the_one_pass_finds_what_the_separate_passes_found(massive_llama_package, tmp_path):
    from decodebench.doctor.doctor import doctor
    from decodebench.doctor.headroom import measure_headroom
    from decodebench.doctor.repair import repair_mlpackage
    from decodebench.formats.coreml.program import quiet_coremltools

    with quiet_coremltools():
        headroom = measure_headroom(massive_llama_package, PROMPTS, steps=4)  # fp32, then fp16
        repair = repair_mlpackage(massive_llama_package, tmp_path / "a.mlpackage", PROMPTS, 4)
        lines: list[str] = []
        report = doctor(massive_llama_package, tmp_path / "b.mlpackage", PROMPTS, 4, lines.append)

    assert report.headroom.hazards == headroom.hazards
    assert len(report.headroom.overflows) == 5
    assert report.headroom.first_non_finite == headroom.first_non_finite
    assert report.headroom.first_non_finite is not None
    assert report.headroom.first_non_finite.label == "layer 1 · input norm · square"
    assert report.headroom.reference_tokens == headroom.reference_tokens
    assert report.repair.reference_tokens == repair.reference_tokens
    assert report.repair.applied == repair.applied == ["norms"]
    for one, separate in zip(
        [report.repair.original, *report.repair.candidates],
        [repair.original, *repair.candidates],
        strict=True,
    ):
        assert one.candidate == separate.candidate
        assert [p.identical for p in one.prompts] == [p.identical for p in separate.prompts]
        assert [p.first_divergent_step for p in one.prompts] == [
            p.first_divergent_step for p in separate.prompts
        ]
        assert [p.non_finite for p in one.prompts] == [p.non_finite for p in separate.prompts]
        for a, b in zip(one.prompts, separate.prompts, strict=True):
            assert a.max_abs_logit_diff == pytest.approx(b.max_abs_logit_diff, rel=1e-3, abs=1e-6)
    # One progress line per prompt.
    assert [line.split(":")[0] for line in lines if line.startswith("prompt ")] == [
        f"prompt {index}/{len(PROMPTS)}" for index in range(1, len(PROMPTS) + 1)
    ]


def test_a_divergence_carries_the_reference_margin_at_that_step(massive_llama_package, tmp_path):
    """A different model diverges from the package; the margin recorded is the reference's
    top-1 minus top-2 logit at the first divergent step, as a fresh run of the reference
    computes it. A candidate that overflows has no margin."""
    import numpy as np

    from decodebench.doctor.proof import prove, top_margin
    from decodebench.formats.coreml.cache_io import decode_session
    from decodebench.formats.coreml.interpreter import Interpreter
    from decodebench.formats.coreml.program import load_package, quiet_coremltools
    from decodebench.formats.coreml.recipe import convert_model, tiny_llama_with_massive_channel
    from decodebench.formats.coreml.widen import widen_program

    def fp32(path):
        program = load_package(path).program
        widen_program(program)
        return decode_session(Interpreter(program), str(path))

    prompt = [1, 2, 3, 4]
    with quiet_coremltools():
        other = tmp_path / "other.mlpackage"
        convert_model(tiny_llama_with_massive_channel(peak=10.0), other, "state", 64)
        fp16 = decode_session(Interpreter(load_package(massive_llama_package).program))
        candidates = {"other": fp32(other), "fp16": fp16}
        proof = prove(fp32(massive_llama_package), candidates, [prompt], steps=6)
        overflowed = proof.agreements["fp16"].prompts[0]
        assert overflowed.non_finite is not None and overflowed.reference_margin is None
        assert list(proof.errors["fp16"]) == [0]
        row = proof.agreements["other"].prompts[0]
        assert not row.identical and row.non_finite is None
        step = row.first_divergent_step
        assert step is not None

        fresh = fp32(massive_llama_package)
        logits = fresh.prefill(prompt)[-1]
        tokens = proof.tokens[0]
        for index in range(step):
            logits = fresh.step(tokens[index], len(prompt) + index)
    assert int(np.argmax(logits)) == tokens[step]
    assert row.reference_margin == pytest.approx(top_margin(logits), rel=1e-5)
    assert row.near_tie == (row.reference_margin < row.max_abs_logit_diff)
    assert top_margin(np.array([1.0, 5.0, 4.5, -2.0], np.float32)) == pytest.approx(0.5)
