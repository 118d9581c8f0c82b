"""The interpreter computes today exactly what it computed when its numerics were pinned.

The pins (``tests/data/interpreter_pins.*``, made by ``python -m tests.support.interpreter_pins``) hold
the outputs of every op case of the interpreter tests and the logits of the tiny builds and of
SmolLM2-135M: a faster interpreter must give the same tokens and the same bits.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.support import interpreter_pins as pins

SUMMARY = json.loads(pins.SUMMARY.read_text())


@pytest.fixture(scope="module")
def pinned() -> dict[str, np.ndarray]:
    with np.load(pins.ARRAYS) as arrays:
        return dict(arrays)


def assert_same_bits(actual: np.ndarray, expected: np.ndarray, what: str) -> None:
    assert actual.dtype == expected.dtype, f"{what}: {actual.dtype} instead of {expected.dtype}"
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    differs = actual.tobytes() != expected.tobytes()
    if differs:
        gap = np.nanmax(np.abs(actual.astype(np.float64) - expected.astype(np.float64)))
        pytest.fail(f"{what}: not bit-identical to the pin (largest difference {gap:g})")


def test_every_op_case_is_pinned_and_bit_identical(pinned: dict[str, np.ndarray]) -> None:
    cases = {name: (build, inputs) for name, build, inputs in pins.op_cases()}
    assert set(SUMMARY["ops"]) <= set(cases)
    for name in SUMMARY["ops"]:
        build, inputs = cases[name]
        outputs = pins.run_op_case(build, inputs)
        assert len(outputs) == sum(key.startswith(f"op/{name}/") for key in pinned)
        for index, output in enumerate(outputs):
            assert_same_bits(np.asarray(output), pinned[f"op/{name}/{index}"], name)


@pytest.mark.slow
@pytest.mark.parametrize("key", sorted(SUMMARY["packages"]))
def test_tiny_package_tokens_and_logits_are_bit_identical(
    key: str, pinned: dict[str, np.ndarray], tmp_path: Path
) -> None:
    preset, attention, quant = key.split("/")
    package = pins.build_tiny(preset, attention, quant, tmp_path)
    tokens, logits = pins.decode(package, pins.PROMPT, pins.STEPS)
    assert tokens == SUMMARY["packages"][key]["tokens"]
    assert_same_bits(logits, pinned[f"package/{key}"], key)


@pytest.mark.slow
def test_smollm2_tokens_and_logits_are_bit_identical() -> None:
    expected = SUMMARY.get("smollm2")
    if expected is None:
        pytest.skip("no SmolLM2 pin (python -m tests.support.interpreter_pins --smollm2)")
    found = pins.decode_smollm2()  # in a process of its own, on the pinned BLAS kernels
    assert found["tokens"] == expected["tokens"]
    assert found["logits_sha256"] == expected["logits_sha256"]
