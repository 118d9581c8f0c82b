"""compat's index_copy workaround (Hugging Face's StaticCache write), and the seam that needs it."""

from __future__ import annotations

import coremltools as ct
import numpy as np
import pytest
import torch

from decodebench.formats.coreml import compat
from decodebench.formats.coreml.interpreter import Interpreter
from decodebench.formats.coreml.program import quiet_coremltools

pytestmark = pytest.mark.slow

CONTEXT, HEADS, DIM = 8, 2, 4


class CacheWrite(torch.nn.Module):
    """Hugging Face StaticCache's write: ``cache.index_copy_(2, positions, new)``, then a read."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("cache", torch.zeros(1, HEADS, CONTEXT, DIM))

    def forward(self, new: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        self.cache.index_copy_(2, positions.long(), new)
        return self.cache * 1.0


def _convert(length: int) -> ct.models.MLModel:
    module = CacheWrite().eval()
    new, positions = torch.randn(1, HEADS, length, DIM), torch.arange(length, dtype=torch.int32)
    traced = compat.trace(module, (new, positions))
    with quiet_coremltools():
        return ct.convert(
            traced,
            inputs=[
                ct.TensorType(name="new", shape=new.shape),
                ct.TensorType(name="positions", shape=positions.shape, dtype=np.int32),
            ],
            outputs=[ct.TensorType(name="cache_out")],
            states=[
                ct.StateType(
                    wrapped_type=ct.TensorType(shape=(1, HEADS, CONTEXT, DIM), dtype=np.float16),
                    name="cache",
                )
            ],
            convert_to="mlprogram",
            minimum_deployment_target=ct.target.iOS18,
            skip_model_load=True,
        )


@pytest.mark.parametrize(("length", "write_op"), [(1, "slice_update"), (3, "scatter")])
def test_index_copy_writes_the_state_like_torch(length: int, write_op: str) -> None:
    compat.install()
    model = _convert(length)
    function = model._mil_program.functions["main"]
    op_types = [op.op_type for op in function.operations]
    assert write_op in op_types and "coreml_update_state" in op_types

    interpreter = Interpreter(model._mil_program)
    states = interpreter.new_states()
    reference = CacheWrite().eval()
    for start in (0, 4):
        new = torch.randn(1, HEADS, length, DIM)
        positions = torch.arange(start, start + length, dtype=torch.int32)
        if length > 1:
            positions = positions.flip(0)  # scatter takes any order, not just a range
        with torch.no_grad():
            expected = reference(new, positions)
        outputs = interpreter.run({"new": new.numpy(), "positions": positions.numpy()}, states)
        np.testing.assert_allclose(outputs["cache_out"], expected.numpy(), atol=2e-3)
        np.testing.assert_allclose(states["cache"], expected.numpy(), atol=2e-3)


def test_the_index_copy_seam_still_exists_without_the_workaround() -> None:
    # When this starts failing, coremltools converts index_copy_ itself: delete the workaround.
    from coremltools.converters.mil.frontend.torch.torch_op_registry import _TORCH_OPS_REGISTRY

    compat.install()
    ours = _TORCH_OPS_REGISTRY.name_to_func_mapping.pop("index_copy")
    try:
        with pytest.raises(NotImplementedError, match="'index_copy_' not implemented"):
            _convert(1)
    finally:
        _TORCH_OPS_REGISTRY.name_to_func_mapping["index_copy"] = ours
    assert compat.installed()
