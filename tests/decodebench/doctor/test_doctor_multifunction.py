"""The doctor drives multifunction packages as a phone runs them: each prompt through the
prefill function, then the decode function a token at a time, whatever the functions are named.

Two packages: one merged by coremltools' multifunction save from two conversions of the same
weights (functions ``decode``, the default, and ``prefill``; no ``main``), and one built by the
project's own builder with a prefill chunk (``main`` and ``prefill``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.cli import run_cli

pytestmark = pytest.mark.slow  # the fixtures convert models

CHUNK = 4
CONTEXT = 64
# Two prompts of a chunk or more (their first chunk goes through prefill) and one shorter than a
# chunk (stepped through the decode function alone).
PROMPTS = [[1, 2, 3, 4, 5, 6], [9, 8, 7], [100, 5, 6, 7, 8]]
NORM = "layer 1 · input norm · square"


@pytest.fixture(scope="module")
def merged_package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The massive-channel Llama (its fp16 norms overflow) as coremltools' multifunction save
    makes it: functions ``decode`` (the default) and ``prefill``."""
    from decodebench.formats.coreml.hf import convert_multifunction
    from decodebench.formats.coreml.program import quiet_coremltools
    from decodebench.formats.coreml.recipe import tiny_llama_with_massive_channel

    target = tmp_path_factory.mktemp("merged") / "model.mlpackage"
    with quiet_coremltools():
        convert_multifunction(tiny_llama_with_massive_channel(), target, CONTEXT, CHUNK)
    return target


def fp32_reference(path: Path):
    """The package's own fp32 run, its prompt through its prefill function."""
    from decodebench.formats.coreml.cache_io import decode_session
    from decodebench.formats.coreml.functions import decode_function, prefill_function
    from decodebench.formats.coreml.interpreter import Interpreter
    from decodebench.formats.coreml.program import load_package
    from decodebench.formats.coreml.widen import widen_program

    loaded = load_package(path)
    widen_program(loaded.program)
    decode = decode_function(loaded.spec, loaded.program)
    prefill = prefill_function(loaded.program, decode)
    assert prefill is not None
    return decode_session(
        Interpreter(loaded.program, decode),
        f"{path} (fp32)",
        prefill=Interpreter(loaded.program, prefill),
    )


def test_functions_are_chosen_as_the_analysis_chooses_them(merged_package: Path) -> None:
    from decodebench.formats.coreml.functions import decode_function, prefill_function
    from decodebench.formats.coreml.graph import decode_function_name
    from decodebench.formats.coreml.program import load_package
    from decodebench.formats.coreml.verify import load_interpreters

    loaded = load_package(merged_package)
    assert sorted(loaded.program.functions) == ["decode", "prefill"]
    assert decode_function(loaded.spec, loaded.program) == decode_function_name(loaded.spec)
    assert decode_function(loaded.spec, loaded.program) == "decode"
    assert prefill_function(loaded.program, "decode") == "prefill"
    decode, prefill = load_interpreters(merged_package)
    assert decode.function_name == "decode"
    assert prefill is not None and prefill.function_name == "prefill"


def test_doctor_cures_a_coremltools_multifunction_package(
    merged_package: Path, massive_llama_checkpoint: Path, tmp_path: Path
) -> None:
    from decodebench.contracts.doctor import DoctorReport
    from decodebench.doctor.proof import prove
    from decodebench.formats.coreml.program import load_package, quiet_coremltools
    from decodebench.formats.coreml.verify import open_session

    out = tmp_path / "cured.mlpackage"
    done = run_cli(
        "doctor", str(merged_package), "--weights", str(massive_llama_checkpoint),
        "--prompts", "2", "--steps", "4", "--out", str(out), "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = DoctorReport.model_validate_json(done.stdout)
    assert report.repair.decode_function == report.headroom.decode_function == "decode"
    assert report.repair.prefill_function == report.headroom.prefill_function == "prefill"
    assert "each prompt through the 'prefill' function" in done.stderr
    # The chat prompts are longer than a chunk: the first overflow is the prefill function's.
    first = report.headroom.first_non_finite
    assert first is not None
    assert first.function == "prefill" and first.label == f"prefill · {NORM}"
    assert "in function 'prefill'" in first.message
    assert all(
        row.non_finite is not None and row.non_finite.startswith(f"prefill · {NORM}: ")
        for row in report.repair.original.prompts
    )
    assert {hazard.layer for hazard in report.headroom.overflows} == {1, 2, None}
    # The fp32 run's peaks are recorded in both functions, each named with its function.
    assert {hazard.function for hazard in report.headroom.overflows} == {None, "prefill"}
    labels = [hazard.label for hazard in report.headroom.overflows]
    assert NORM in labels and f"prefill · {NORM}" in labels
    assert report.repair.applied[0] == "norms" and report.repair.result.share == 1.0
    # The checkpoint is the package's own model: transformers fp32 decodes the same tokens.
    assert report.checkpoint is not None and report.checkpoint.repaired.share == 1.0

    # The repaired package keeps both functions, its default, and decodes: its prompt through
    # its prefill function, the fp32 reference's tokens on prompts of its own.
    repaired = load_package(out)
    assert sorted(repaired.program.functions) == ["decode", "prefill"]
    assert repaired.spec.description.defaultFunctionName == "decode"
    session = open_session(out)
    assert session.has_prefill
    with quiet_coremltools():
        proof = prove(fp32_reference(merged_package), {"repaired": session}, PROMPTS, steps=6)
        original = prove(
            fp32_reference(merged_package), {"original": open_session(merged_package)}, PROMPTS, 2
        )
    assert proof.agreements["repaired"].share == 1.0
    assert all(row.non_finite is None for row in proof.agreements["repaired"].prompts)
    assert list(original.errors["original"]) == [0, 1, 2]  # it cannot decode at all


def test_an_overflow_only_the_prefill_function_makes_is_caught_and_repaired(
    tmp_path: Path,
) -> None:
    """Decode converted from a model whose norms stay finite in fp16, prefill from one whose
    norms overflow: a proof that stepped the prompt through the decode function would find
    nothing wrong."""
    from decodebench.doctor.doctor import doctor
    from decodebench.doctor.headroom import measure_headroom
    from decodebench.doctor.proof import prove
    from decodebench.formats.coreml.hf import convert_multifunction
    from decodebench.formats.coreml.program import quiet_coremltools
    from decodebench.formats.coreml.recipe import tiny_llama_with_massive_channel
    from decodebench.formats.coreml.verify import open_session

    package = tmp_path / "model.mlpackage"
    with quiet_coremltools():
        convert_multifunction(
            tiny_llama_with_massive_channel(peak=10.0),
            package,
            CONTEXT,
            CHUNK,
            names=("decode_step", "prefill_chunk"),
            prefill_model=tiny_llama_with_massive_channel(),
        )
        report = doctor(package, tmp_path / "cured.mlpackage", PROMPTS, 4)
        separate = measure_headroom(package, PROMPTS, 4)  # its own fp32 and fp16 runs
        # The same decode function alone, prompts stepped: no non-finite value anywhere.
        alone = open_session(package)
        alone.prefill_interpreter = None  # type: ignore[attr-defined]
        stepped = prove(fp32_reference(package), {"decode alone": alone}, PROMPTS, 4)
    assert not stepped.errors["decode alone"]

    assert report.repair.decode_function == "decode_step"
    assert report.repair.prefill_function == "prefill_chunk"
    first = report.headroom.first_non_finite
    assert first is not None and first.prompt == 0
    assert first.function == "prefill_chunk" and first.label == f"prefill_chunk · {NORM}"
    rows = report.repair.original.prompts
    # Prompts 0 and 2 hold a chunk: overflow at step 0. Prompt 1 is shorter than a chunk.
    assert [row.non_finite is not None for row in rows] == [True, False, True]
    assert [row.first_divergent_step for row in rows] == [0, None, 0]
    # Only the prefill function's ops overflow, on the two prompts it ran.
    overflows = report.headroom.overflows
    assert overflows and {hazard.function for hazard in overflows} == {"prefill_chunk"}
    assert all(hazard.label.startswith("prefill_chunk · ") for hazard in overflows)
    assert max(hazard.overflow_prompts for hazard in overflows) == 2
    assert separate.hazards == report.headroom.hazards
    assert separate.first_non_finite == report.headroom.first_non_finite
    assert report.repair.applied[0] == "norms" and report.repair.result.share == 1.0


def test_doctor_drives_a_package_of_the_projects_own_builder(
    massive_llama_checkpoint: Path, tmp_path: Path
) -> None:
    """``decodebench build --prefill-chunk``: functions ``main`` and ``prefill``. Its norms are
    overflow-safe; with repeated KV heads the fold is the repair, proven through prefill."""
    from decodebench.contracts.doctor import DoctorReport
    from decodebench.doctor.proof import prove
    from decodebench.formats.coreml.program import load_package, quiet_coremltools
    from decodebench.formats.coreml.verify import open_session

    built = run_cli(
        "build", "--weights", str(massive_llama_checkpoint), "--kv", "state",
        "--attention", "repeat_kv", "--context", str(CONTEXT), "--prefill-chunk", str(CHUNK),
        "--out", str(tmp_path / "built"), "--no-cache", "--quiet",
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    package = tmp_path / "built" / "model.mlpackage"
    out = tmp_path / "cured.mlpackage"
    done = run_cli(
        "doctor", str(package), "--weights", str(massive_llama_checkpoint), "--prompts", "2",
        "--steps", "4", "--out", str(out), "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = DoctorReport.model_validate_json(done.stdout)
    assert report.repair.decode_function == "main"
    assert report.repair.prefill_function == "prefill"
    assert report.headroom.first_non_finite is None
    assert report.repair.original.share == 1.0
    assert report.repair.applied == ["fold"] and report.repair.result.share == 1.0

    repaired = load_package(out)
    assert sorted(repaired.program.functions) == ["main", "prefill"]
    session = open_session(out)
    assert session.has_prefill
    with quiet_coremltools():
        proof = prove(fp32_reference(package), {"repaired": session}, PROMPTS, steps=6)
    assert proof.agreements["repaired"].share == 1.0
