"""The overflow-safe norm rewrite, on each normalisation as coremltools converts it in fp16."""

from __future__ import annotations

import numpy as np
import pytest

from tests.support.norms import (
    DecomposedLayerNorm,
    LlamaStyleRmsNorm,
    SqrtDivRmsNorm,
    TorchRmsNorm,
    converted_norm,
    massive_row,
    reference,
)

pytestmark = pytest.mark.slow  # each case converts a module with coremltools (about a second)

OVERFLOWING = [
    (LlamaStyleRmsNorm, "rms", "rsqrt"),
    (SqrtDivRmsNorm, "rms", "sqrt"),
    (DecomposedLayerNorm, "layer", "rsqrt"),
]


def _run(program, x):
    from decodebench.formats.coreml.interpreter import Interpreter

    return Interpreter(program).run({"x": x})["y"].astype(np.float32)


@pytest.mark.parametrize(("module_class", "kind", "root"), OVERFLOWING)
def test_a_traced_norm_that_overflows_in_fp16_is_rewritten_and_matches_fp32(
    module_class, kind, root
):
    from decodebench.formats.coreml.interpreter import NonFiniteError
    from decodebench.formats.coreml.norm_repair import repair_norms
    from decodebench.formats.coreml.norms import find_norms

    module = module_class()
    program = converted_norm(module)
    norms = find_norms(program.functions["main"])
    assert [(norm.kind, norm.root.op_type) for norm in norms] == [(kind, root)]
    x = massive_row(1000.0)  # 1000² = 1e6 > 65,504
    with pytest.raises(NonFiniteError, match="infinity"):
        _run(program, x)

    repairs = repair_norms(program)

    assert [repair.status for repair in repairs] == ["rewritten"]
    expected = reference(module, x)
    got = _run(program, x)
    np.testing.assert_allclose(got, expected, rtol=2e-3, atol=2e-3 * np.abs(expected).max())
    ordinary = massive_row(3.0, seed=1)  # no overflow: the rewrite changes nothing beyond rounding
    np.testing.assert_allclose(_run(program, ordinary), reference(module, ordinary), atol=1e-2)
    assert find_norms(program.functions["main"]) == []  # the old chain is gone


def test_coremltools_rms_norm_lowering_gets_its_eps_back_and_survives_a_zero_row():
    from decodebench.formats.coreml.interpreter import NonFiniteError
    from decodebench.formats.coreml.norm_repair import repair_norms
    from decodebench.formats.coreml.norms import find_norms

    module = TorchRmsNorm(eps=1e-2)
    program = converted_norm(module)
    norms = find_norms(program.functions["main"])
    assert [norm.kind for norm in norms] == ["coreml_rms"]
    # One channel at 100, the rest small: mean(x²) ≈ 156, but the lowering adds eps·max|x|² = 100.
    x = massive_row(100.0)
    x[..., 8:] *= np.float16(0.01)
    expected = reference(module, x)
    before = _run(program, x)
    assert np.abs(before - expected).max() > 0.05 * np.abs(expected).max()
    with pytest.raises(NonFiniteError, match="NaN"):
        _run(program, np.zeros_like(x))  # 0 / max|0|

    assert [repair.status for repair in repair_norms(program)] == ["rewritten"]

    np.testing.assert_allclose(
        _run(program, x), expected, rtol=2e-3, atol=2e-3 * np.abs(expected).max()
    )
    assert not _run(program, np.zeros_like(x)).any()


def test_a_norm_kept_in_fp32_is_left_alone():
    import coremltools as ct
    import torch

    from decodebench.formats.coreml import compat
    from decodebench.formats.coreml.norm_repair import repair_norms

    compat.install()
    module = LlamaStyleRmsNorm().eval()
    traced = compat.trace(module, (torch.randn(1, 1, 64),))
    program = ct.convert(
        traced,
        inputs=[ct.TensorType(name="x", shape=(1, 1, 64), dtype=np.float32)],
        outputs=[ct.TensorType(name="y", dtype=np.float32)],
        convert_to="milinternal",
        minimum_deployment_target=ct.target.iOS18,
        compute_precision=ct.precision.FLOAT32,
    )

    repairs = repair_norms(program)

    assert [(repair.status, repair.reason) for repair in repairs] == [
        ("left", "computed in fp32 already")
    ]
