"""`decodebench repair`: the norm rewrite proven against the package's own fp32 run."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow  # the fixtures convert models

PROMPTS = [[1, 2, 3, 4], [9, 8, 7], [100, 5]]


def test_repair_makes_the_overflowing_package_agree_with_its_fp32_self(
    massive_llama_package, tmp_path
):
    from decodebench.doctor.headroom import first_non_finite
    from decodebench.doctor.repair import repair_mlpackage

    target = tmp_path / "repaired.mlpackage"
    report = repair_mlpackage(massive_llama_package, target, PROMPTS, steps=4)

    assert report.original.non_finite == len(PROMPTS)
    assert report.applied == ["norms"]
    assert {norm.status for norm in report.norms} == {"rewritten"}
    assert len(report.norms) == 7  # 3 layers x 2 and the final norm
    assert report.result.share == 1.0
    assert report.result.max_abs_logit_diff < 0.05
    assert first_non_finite(target, PROMPTS, 4) is None


def test_a_package_with_nothing_to_repair_is_copied_and_says_so(massive_llama_package, tmp_path):
    from decodebench.analysis.analyze import analyze_mlpackage
    from decodebench.doctor.repair import repair_mlpackage
    from decodebench.doctor.repair_text import render

    once = tmp_path / "once.mlpackage"
    repair_mlpackage(massive_llama_package, once, PROMPTS[:1], steps=2)
    twice = tmp_path / "twice.mlpackage"
    report = repair_mlpackage(once, twice, PROMPTS[:1], steps=2)

    assert report.applied == []
    assert {norm.status for norm in report.norms} <= {"left"}
    assert "applied        nothing" in render(report)
    assert analyze_mlpackage(twice).op_counts == analyze_mlpackage(once).op_counts


def test_the_output_must_differ_from_the_input(massive_llama_package):
    from decodebench.doctor.repair import repair_mlpackage
    from decodebench.formats.coreml.program import MilError

    with pytest.raises(MilError, match="must differ"):
        repair_mlpackage(massive_llama_package, massive_llama_package, [[1]], steps=1)


def test_prompts_and_steps_past_the_context_are_refused_before_any_proof(
    massive_llama_package, tmp_path
):
    from decodebench.doctor.repair import repair_mlpackage
    from decodebench.formats.coreml.program import MilError

    target = tmp_path / "repaired.mlpackage"
    with pytest.raises(MilError, match=r"4 tokens and 100000 steps .* context is \d+"):
        repair_mlpackage(massive_llama_package, target, PROMPTS, steps=100_000)
    assert not target.exists()


def test_smollm2_by_the_apple_recipe_overflows_at_layer_2_and_repaired_answers_paris(
    smollm2_recipe_package, smollm2_folder, tmp_path
):
    import numpy as np

    from decodebench.doctor.headroom import first_non_finite
    from decodebench.formats.coreml.inputs import recognise
    from decodebench.formats.coreml.interpreter import Interpreter
    from decodebench.formats.coreml.norm_repair import repair_norms
    from decodebench.formats.coreml.program import load_package
    from decodebench.formats.coreml.verify import DecodeSession
    from decodebench.prompts import chat_token_ids, decode_text

    prompt = chat_token_ids(smollm2_folder, ["What is the capital of France?"])[0]
    found = first_non_finite(smollm2_recipe_package, [prompt], steps=1)
    assert found is not None and found.label == "layer 2 · input norm · square"

    program = load_package(smollm2_recipe_package).program
    assert {repair.status for repair in repair_norms(program)} == {"rewritten"}
    interpreter = Interpreter(program)
    session = DecodeSession(interpreter, recognise(interpreter))
    tokens = [int(np.argmax(session.prefill(prompt)[-1]))]
    for step in range(7):
        tokens.append(session.next_token(tokens[-1], len(prompt) + step))
    assert decode_text(smollm2_folder, tokens).startswith("The capital of France is Paris.")


def test_on_a_healthy_repeat_kv_build_the_fold_is_kept(tmp_path):
    from decodebench.analysis.analyze import analyze_mlpackage
    from decodebench.building.build import PACKAGE_NAME, build_variant
    from decodebench.contracts.domain import VariantSpec

    build_variant("tiny-gqa", VariantSpec(attention="repeat_kv", context=64), tmp_path / "rkv")
    source = tmp_path / "rkv" / PACKAGE_NAME
    target = tmp_path / "repaired.mlpackage"

    report = repair_mlpackage_quietly(source, target)

    assert report.original.share == 1.0  # nothing overflows: the fp16 build already agrees
    assert report.fold is not None and report.fold.rewritten > 0
    assert report.applied == ["fold"]
    assert report.norms == []  # the project's own RMSNorm is pre-scaled already, not a pattern
    assert analyze_mlpackage(target).tile_ops == 0 < analyze_mlpackage(source).tile_ops


def test_a_norm_rewrite_that_does_not_improve_agreement_is_not_applied(tmp_path):
    from decodebench.formats.coreml.recipe import convert_model, tiny_llama_with_massive_channel

    source = tmp_path / "benign.mlpackage"
    convert_model(tiny_llama_with_massive_channel(peak=10.0), source, "state", 64)
    target = tmp_path / "repaired.mlpackage"

    report = repair_mlpackage_quietly(source, target)

    assert report.original.share == 1.0 and report.original.non_finite == 0
    assert {norm.status for norm in report.norms} == {"rewritten"}
    assert report.applied == []
    assert report.refused == {"norms": "does not improve agreement with the fp32 reference"}
    assert (target / "Manifest.json").read_bytes() == (source / "Manifest.json").read_bytes()


def repair_mlpackage_quietly(source, target):
    from decodebench.doctor.repair import repair_mlpackage
    from decodebench.formats.coreml.program import quiet_coremltools

    with quiet_coremltools():
        return repair_mlpackage(source, target, [[1, 2, 3], [7, 5]], steps=3)
