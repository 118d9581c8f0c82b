"""The torch 2.13 / coremltools 9.0 workarounds, and the seams that still need them."""

from __future__ import annotations

import warnings

import coremltools as ct
import numpy as np
import pytest
import torch
from coremltools.converters.mil.frontend.torch.torch_op_registry import register_torch_op

from decodebench.formats.coreml import compat

NUMPY_SCALAR_DEPRECATION = "Conversion of an array with ndim > 0 to a scalar"


class ShapeArithmetic(torch.nn.Module):
    """The Hugging Face patterns that trace into aten::Int of rank-1 constants."""

    def forward(self, query: torch.Tensor, kv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        half = query.shape[-1] // 2
        rotated = torch.cat((-query[..., half:], query[..., :half]), dim=-1)
        batch, heads, length, dim = kv.shape
        repeated = kv[:, :, None].expand(batch, heads, 4, length, dim)
        return rotated, repeated.reshape(batch, heads * 4, length, dim)


def _convert_shape_arithmetic() -> ct.models.MLModel:
    query, kv = torch.randn(1, 4, 1, 8), torch.randn(1, 2, 3, 8)
    traced = compat.trace(ShapeArithmetic().eval(), (query, kv))
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "error", message=NUMPY_SCALAR_DEPRECATION, category=DeprecationWarning
        )
        return ct.convert(
            traced,
            inputs=[
                ct.TensorType(name="query", shape=query.shape),
                ct.TensorType(name="kv", shape=kv.shape),
            ],
            outputs=[ct.TensorType(name="rotated"), ct.TensorType(name="repeated")],
            convert_to="mlprogram",
            minimum_deployment_target=ct.target.iOS18,
            skip_model_load=True,
        )


def _output_shapes(model: ct.models.MLModel) -> list[list[int]]:
    return [
        list(output.type.multiArrayType.shape) for output in model.get_spec().description.output
    ]


def test_install_is_idempotent() -> None:
    compat.install()
    compat.install()
    assert compat.installed()
    assert compat._original_int_converter is not compat._int


def test_shape_arithmetic_converts_without_numpy_deprecation() -> None:
    compat.install()
    model = _convert_shape_arithmetic()
    assert _output_shapes(model) == [[1, 4, 1, 8], [1, 8, 3, 8]]


def test_the_aten_int_seam_still_exists_without_the_override() -> None:
    # When this starts passing without the override, delete the workaround.
    compat.install()
    original = compat._original_int_converter
    assert original is not None
    register_torch_op(original, torch_alias=["int"], override=True)
    try:
        with pytest.raises((DeprecationWarning, TypeError)):
            _convert_shape_arithmetic()
    finally:
        register_torch_op(compat._int, torch_alias=["int"], override=True)
    assert compat.installed()


@pytest.mark.parametrize(
    ("value", "expected"), [(3, 3), (np.int32(4), 4), (np.array(5), 5), (np.array([6]), 6)]
)
def test_single_int_takes_the_one_element(value: object, expected: int) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert compat.single_int(value) == expected


def test_single_int_refuses_several_elements() -> None:
    with pytest.raises(ValueError, match="single element"):
        compat.single_int(np.array([1, 2]))


def test_trace_hides_only_the_torchscript_deprecation() -> None:
    module = ShapeArithmetic().eval()
    inputs = (torch.randn(1, 4, 1, 8), torch.randn(1, 2, 3, 8))
    with pytest.warns(DeprecationWarning, match="torch.jit.trace"):
        torch.jit.trace(module, inputs)  # the seam: torch 2.13 deprecates tracing
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        traced = compat.trace(module, inputs)
    for got, expected in zip(traced(*inputs), module(*inputs), strict=True):
        torch.testing.assert_close(got, expected)
