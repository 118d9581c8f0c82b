"""The GQA fold pass on attention graphs the project did not write: every replication style, both
head mappings, decode and prefill shapes, and the refusals (graph left exactly as it was)."""

from __future__ import annotations

from pathlib import Path

import coremltools as ct
import numpy as np
import pytest
import torch
from coremltools.converters.mil import Builder as mb
from coremltools.converters.mil.mil import types
from coremltools.converters.mil.mil.passes.pass_registry import PASS_REGISTRY

from decodebench.formats.coreml import compat
from decodebench.formats.coreml.fold import PASS_NAME, FoldGqaPass, fold_program
from decodebench.formats.coreml.fold_package import fold_mlpackage
from decodebench.formats.coreml.interpreter import Interpreter
from decodebench.formats.coreml.program import load_package, quiet_coremltools

pytestmark = pytest.mark.slow

HEADS, KV_HEADS, DIM, KEYS = 8, 2, 16, 12
GROUP = HEADS // KV_HEADS
SCALE = DIM**-0.5


def replicate(x: torch.Tensor, style: str) -> torch.Tensor:
    batch, kv_heads, length, dim = x.shape
    if style == "expand":  # transformers' repeat_kv: head h reads KV h // G
        return (
            x[:, :, None].expand(batch, kv_heads, GROUP, length, dim).reshape(1, HEADS, length, dim)
        )
    if style == "repeat":  # head h reads KV h % Hkv
        return x.repeat(1, GROUP, 1, 1)
    if style == "concat":  # concat of copies, h % Hkv
        return torch.cat([x] * GROUP, dim=1)
    if style == "concat_grouped":  # copies on a new group axis, h // G
        return torch.cat([x[:, :, None]] * GROUP, dim=2).reshape(1, HEADS, length, dim)
    if style == "scrambled":  # positions and heads mixed: not a head replication at all
        expanded = x[:, :, None].expand(batch, kv_heads, GROUP, length, dim)
        return expanded.transpose(2, 3).reshape(1, HEADS, length, dim)
    raise ValueError(style)


class Attention(torch.nn.Module):
    def __init__(self, style: str, mix_heads: bool = False, scores_out: bool = False) -> None:
        super().__init__()
        self.style, self.mix_heads, self.scores_out = style, mix_heads, scores_out

    def forward(self, query, key, value, mask):  # noqa: ANN001, ANN201 (traced)
        keys, values = replicate(key, self.style), replicate(value, self.style)
        scores = torch.matmul(query, keys.transpose(-1, -2)) * SCALE + mask
        if self.mix_heads:  # "talking heads": every head sees the mean over heads
            scores = scores + scores.mean(dim=1, keepdim=True)
        probabilities = torch.softmax(scores.float(), dim=-1).to(query.dtype)
        output = torch.matmul(probabilities, values)
        return (output, scores) if self.scores_out else output


def example(queries: int, mask_heads: int = 1) -> dict[str, np.ndarray]:
    generator = np.random.default_rng(queries)
    mask = np.zeros((1, mask_heads, queries, KEYS), np.float32)
    for row in range(queries):  # causal over the last `queries` keys
        mask[:, :, row, KEYS - queries + row + 1 :] = -np.inf
    return {
        "query": generator.standard_normal((1, HEADS, queries, DIM)).astype(np.float32),
        "key": generator.standard_normal((1, KV_HEADS, KEYS, DIM)).astype(np.float32),
        "value": generator.standard_normal((1, KV_HEADS, KEYS, DIM)).astype(np.float32),
        "mask": mask,
    }


def convert(
    module: torch.nn.Module, inputs: dict[str, np.ndarray], path: Path, pipeline=None
) -> Path:
    tensors = tuple(torch.from_numpy(value) for value in inputs.values())
    traced = compat.trace(module.eval(), tensors)
    outputs = [ct.TensorType(name="output")]
    if getattr(module, "scores_out", False):
        outputs.append(ct.TensorType(name="scores"))
    with quiet_coremltools():
        model = ct.convert(
            traced,
            inputs=[ct.TensorType(name=name, shape=value.shape) for name, value in inputs.items()],
            outputs=outputs,
            convert_to="mlprogram",
            minimum_deployment_target=ct.target.iOS18,
            compute_precision=ct.precision.FLOAT16,
            pass_pipeline=pipeline,
            skip_model_load=True,
        )
    model.save(str(path))
    return path


def run(program, inputs: dict[str, np.ndarray]) -> np.ndarray:
    return Interpreter(program).run(inputs)["output"].astype(np.float32)


def reference(module: torch.nn.Module, inputs: dict[str, np.ndarray]) -> np.ndarray:
    with torch.no_grad():
        output = module(*(torch.from_numpy(value) for value in inputs.values()))
    return (output[0] if isinstance(output, tuple) else output).numpy()


def op_types(program) -> list[str]:
    return [op.op_type for op in program.functions["main"].operations]


@pytest.mark.parametrize("queries", [1, 5], ids=["decode", "prefill"])
@pytest.mark.parametrize(
    ("style", "mapping"),
    [
        ("expand", "h // G"),
        ("repeat", "h % Hkv"),
        ("concat", "h % Hkv"),
        ("concat_grouped", "h // G"),
    ],
)
def test_fold_removes_replication_and_keeps_the_result(
    style: str, mapping: str, queries: int, tmp_path: Path
) -> None:
    inputs = example(queries)
    module = Attention(style)
    package = convert(module, inputs, tmp_path / "attention.mlpackage")
    original = load_package(package).program
    assert {"tile", "concat"} & set(op_types(original))  # the converter really replicated

    folded = load_package(package).program
    report = fold_program(folded)
    (pattern,) = report.patterns
    assert pattern.status == "rewritten", pattern.reasons
    assert (pattern.head_mapping, pattern.query_heads, pattern.kv_heads) == (
        mapping,
        HEADS,
        KV_HEADS,
    )
    assert pattern.query_length == queries
    remaining = op_types(folded)
    assert "concat" not in remaining
    # Prefill merges group and query rows; only the (shared) causal mask is tiled to match.
    assert remaining.count("tile") == (1 if queries > 1 else 0)
    assert len(report.mask_alignments) == (1 if queries > 1 else 0)

    before, after = run(original, inputs), run(folded, inputs)
    np.testing.assert_allclose(after, before, atol=2e-3)
    np.testing.assert_allclose(after, reference(module, inputs), atol=1e-2)


def test_head_mixing_between_the_matmuls_is_refused_unchanged(tmp_path: Path) -> None:
    inputs = example(1)
    package = convert(Attention("expand", mix_heads=True), inputs, tmp_path / "mixing.mlpackage")
    program = load_package(package).program
    text_before = str(program)

    report = fold_program(program)
    (pattern,) = report.patterns
    assert pattern.status == "refused"
    assert any("reduce_mean" in reason and "mixes heads" in reason for reason in pattern.reasons)
    assert str(program) == text_before
    assert report.removed_ops == {} and report.added_ops == {}

    out = tmp_path / "out.mlpackage"
    package_report = fold_mlpackage(package, out)
    assert package_report.fold.refused == 1 and not package_report.changed
    assert _tree_bytes(out) == _tree_bytes(package)
    assert package_report.after == package_report.before


def test_scrambled_replication_is_refused_as_unproven(tmp_path: Path) -> None:
    program = load_package(
        convert(Attention("scrambled"), example(1), tmp_path / "s.mlpackage")
    ).program
    text_before = str(program)
    (pattern,) = fold_program(program).patterns
    assert pattern.status == "refused"
    assert any(
        "cannot be proven" in reason and "in order h // G or h % Hkv" in reason
        for reason in pattern.reasons
    )
    assert str(program) == text_before


def test_per_head_mask_and_exported_scores_are_refused(tmp_path: Path) -> None:
    per_head = convert(Attention("expand"), example(1, mask_heads=HEADS), tmp_path / "m.mlpackage")
    (pattern,) = fold_program(load_package(per_head).program).patterns
    assert pattern.status == "refused"
    assert any("differs per head" in reason for reason in pattern.reasons)

    exported = convert(Attention("expand", scores_out=True), example(1), tmp_path / "o.mlpackage")
    program = load_package(exported).program
    text_before = str(program)
    (pattern,) = fold_program(program).patterns
    assert pattern.status == "refused"
    assert any("is an output of the program" in reason for reason in pattern.reasons)
    assert str(program) == text_before


def test_scaled_dot_product_attention_op_is_folded() -> None:
    inputs = example(3)
    specs = [mb.TensorSpec(value.shape, types.fp16) for value in inputs.values()]

    @mb.program(input_specs=specs, opset_version=ct.target.iOS18)
    def program(query, key, value, mask):
        keys = mb.tile(x=key, reps=[1, GROUP, 1, 1])  # h % Hkv
        values = mb.tile(x=value, reps=[1, GROUP, 1, 1])
        return mb.scaled_dot_product_attention(query=query, key=keys, value=values, attn_mask=mask)

    feed = {name: value.astype(np.float16) for name, value in inputs.items()}
    before = next(iter(Interpreter(program).run(feed).values()))
    report = fold_program(program)
    assert (report.rewritten, report.patterns[0].kind) == (1, "sdpa")
    assert op_types(program).count("tile") == 1  # the mask, aligned to G x 3 rows
    after = next(iter(Interpreter(program).run(feed).values()))
    np.testing.assert_allclose(after.astype(np.float32), before.astype(np.float32), atol=2e-3)


def test_the_pass_is_registered_and_runs_inside_ct_convert(tmp_path: Path) -> None:
    assert PASS_NAME in PASS_REGISTRY
    assert isinstance(PASS_REGISTRY[PASS_NAME], FoldGqaPass)
    pipeline = ct.PassPipeline.DEFAULT
    pipeline.append_pass(PASS_NAME)
    inputs = example(4)
    module = Attention("repeat")
    package = convert(module, inputs, tmp_path / "pipeline.mlpackage", pipeline=pipeline)
    program = load_package(package).program
    assert op_types(program).count("tile") == 1  # only the aligned mask
    np.testing.assert_allclose(run(program, inputs), reference(module, inputs), atol=1e-2)


def _tree_bytes(root: Path) -> dict[str, bytes]:
    return {
        str(path.relative_to(root)): path.read_bytes()
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


def test_a_rewrite_coremltools_rejects_is_undone_and_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    inputs = example(5)
    program = load_package(convert(Attention("expand"), inputs, tmp_path / "a.mlpackage")).program
    text_before = str(program)

    def rejected(**_: object) -> None:
        raise ValueError("type inference says no")

    monkeypatch.setattr(mb, "softmax", rejected)  # fails after the mask tile and scores exist
    report = fold_program(program)
    (pattern,) = report.patterns
    assert pattern.status == "refused"
    assert pattern.reasons == ["rewrite failed, pattern left as is: type inference says no"]
    assert report.mask_alignments == []
    assert str(program) == text_before
