"""Non-finite values: the interpreter names the op that made one, verify and build refuse."""

from __future__ import annotations

import json
from pathlib import Path

import coremltools as ct
import numpy as np
import pytest
from coremltools.converters.mil import Builder as mb
from coremltools.converters.mil.mil import types

from decodebench.building.build import BuildError, check_finite_decode
from decodebench.cli import main
from decodebench.formats.coreml.interpreter import Interpreter, NonFiniteError
from decodebench.formats.coreml.program import load_package, quiet_coremltools
from tests.support.mil import decoder_norm, naive_fp16_norm

WIDTH = 576
VOCAB = 16


def test_overflowing_norm_is_caught_with_the_op_named() -> None:
    interpreter = Interpreter(naive_fp16_norm(WIDTH))
    small = np.linspace(-3, 3, WIDTH, dtype=np.float16)[None]
    assert np.isfinite(interpreter.run({"x": small})["normed"]).all()
    residual = small.copy()
    residual[0, 7] = 1000.0  # a real residual stream's outlier: 1000^2 > 65504
    with pytest.raises(NonFiniteError, match=r"'square_overflows' \(pow -> .*infinity") as caught:
        interpreter.run({"x": residual})
    assert (caught.value.op_name, caught.value.op_type) == ("square_overflows", "pow")
    unchecked = Interpreter(naive_fp16_norm(WIDTH), check_finite=False).run({"x": residual})
    # Unchecked, rsqrt(inf) = 0 silently zeroes the whole row: the garbage a device decodes.
    assert not unchecked["normed"].any()


def test_a_masked_infinity_passed_on_is_not_an_error() -> None:
    @mb.program(input_specs=[mb.TensorSpec((1, 4), types.fp16), mb.TensorSpec((1, 4), types.fp16)])
    def attend(scores, mask):
        return mb.softmax(x=mb.add(x=scores, y=mask), axis=-1)

    mask = np.array([[0, 0, -np.inf, -np.inf]], np.float16)
    probabilities = Interpreter(attend).run({"scores": np.ones((1, 4), np.float16), "mask": mask})
    np.testing.assert_allclose(next(iter(probabilities.values())), [[0.5, 0.5, 0, 0]])


@pytest.mark.slow
def test_the_decoder_norm_stays_finite_and_exact_in_fp16() -> None:
    interpreter = Interpreter(decoder_norm(WIDTH))
    # the helper's gains, as its RMSNorm holds them (fp32)
    gains = np.linspace(0.5, 1.5, WIDTH, dtype=np.float32).astype(np.float64)
    generator = np.random.default_rng(0)
    for magnitude in (3000.0, 30.0, 1e-3):  # a real outlier, ordinary, and where eps matters
        x = (generator.standard_normal((1, WIDTH)) * magnitude / 4).astype(np.float16)
        x[0, 3] = magnitude
        output = next(iter(interpreter.run({"x": x}).values())).astype(np.float64)
        wide = x.astype(np.float64)
        expected = gains * wide / np.sqrt(np.mean(wide**2) + 1e-5)
        np.testing.assert_allclose(output, expected, rtol=3e-3, atol=3e-3 * np.abs(expected).max())


def _decode_package(path: Path, weight_scale: float) -> Path:
    """A stateful one-op-deep decode step whose logits are ``(token + 1) * scale * arange``."""

    @mb.program(
        input_specs=[
            mb.TensorSpec((1, 1), types.int32),
            mb.StateTensorSpec((1, 1, 8, 4), types.fp16),
        ],
        opset_version=ct.target.iOS18,
    )
    def step(input_ids, key_cache):
        cache = mb.read_state(input=key_cache)
        token = mb.add(x=mb.cast(x=input_ids, dtype="fp16"), y=np.float16(1.0))
        base = mb.add(x=token, y=mb.reduce_sum(x=cache, axes=[1, 2, 3]))
        row = (np.arange(VOCAB) * weight_scale).astype(np.float16)[None]
        return mb.mul(x=base, y=row, name="logits")

    with quiet_coremltools():
        model = ct.convert(step, minimum_deployment_target=ct.target.iOS18, skip_model_load=True)
        model.save(str(path))
    return path


@pytest.fixture(scope="module")
def decode_packages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("nonfinite")
    return {
        "fine": _decode_package(root / "fine.mlpackage", 0.01),
        "twin": _decode_package(root / "twin.mlpackage", 0.01),
        "overflows": _decode_package(root / "overflows.mlpackage", 4000.0),
    }


@pytest.mark.slow
def test_verify_fails_on_non_finite_logits(decode_packages, capsys) -> None:  # noqa: ANN001
    fine, twin = str(decode_packages["fine"]), str(decode_packages["twin"])
    assert main(["verify", fine, twin, "--steps", "2", "--prompt", "1,2"]) == 0
    capsys.readouterr()
    bad = str(decode_packages["overflows"])
    code = main(["verify", fine, bad, "--steps", "2", "--prompt", "1,2", "--json"])
    result = json.loads(capsys.readouterr().out)
    assert code == 1 and not result["agree"]
    assert result["non_finite"].startswith(f"{bad}: ")
    assert "'logits' (mul -> logits)" in result["non_finite"]
    assert main(["verify", bad, fine, "--steps", "2", "--prompt", "1,2"]) == 1
    assert "NON-FINITE" in capsys.readouterr().out


@pytest.mark.slow
def test_build_refuses_to_publish_a_non_finite_package(decode_packages) -> None:  # noqa: ANN001
    check_finite_decode(decode_packages["fine"])
    with pytest.raises(BuildError, match=r"not published: .*'logits' \(mul -> logits\)"):
        check_finite_decode(decode_packages["overflows"])
    assert load_package(decode_packages["overflows"])  # the check only reads


def test_build_check_drives_a_package_with_kv_as_inputs_and_outputs(
    massive_llama_io_package, massive_llama_package, tmp_path
) -> None:  # noqa: ANN001
    """The older layout (whole caches in and out) is driven, not refused: its overflow is named,
    and once repaired it decodes the stateful package's tokens."""
    from decodebench.building.agreement import PackageDecoder
    from decodebench.doctor.repair import repair_mlpackage

    with pytest.raises(BuildError, match="not finite.*pow"):
        check_finite_decode(massive_llama_io_package)
    prompts = [[5, 9, 3, 7]]
    repaired = {}
    for name, package in (("io", massive_llama_io_package), ("state", massive_llama_package)):
        target = tmp_path / f"{name}.mlpackage"
        report = repair_mlpackage(package, target, prompts, 3)
        assert report.applied == ["norms"]
        check_finite_decode(target)
        repaired[name] = PackageDecoder(target).greedy(prompts[0], 6)
    assert repaired["io"] == repaired["state"]
