"""Core AI's known iPhone faults are found in a program before a phone sees it, each warning
naming its op; the project's own builds meet none of them."""

from __future__ import annotations

from pathlib import Path

from decodebench.analysis.graph import Graph, Op, Tensor
from decodebench.formats.coreai.faults import known_faults


def _graph(ops: list[tuple[str, str, str]], states: dict[str, tuple[int, ...]] = {}) -> Graph:  # noqa: B006
    """A function of ``ops`` (type, name, output dtype), with K/V states of the given shapes."""
    inputs = {name: Tensor(shape, "float16", 16, state=True) for name, shape in states.items()}
    graph = Graph(name="main", opset="coreai", inputs=inputs, outputs=[])
    for kind, name, dtype in ops:
        graph.add(Op(type=kind, name=name, outputs=[f"{name}_out"]),
                  {f"{name}_out": Tensor((1, 8), dtype, 16)}, [])  # fmt: skip
    return graph


def test_each_known_fault_is_named_by_its_op() -> None:
    graph = _graph(
        [("argmax", "argmax_9", "int32"), ("exp", "exp_3", "float16"),
         ("exp", "exp_4", "float32"), ("slice_update", "write_k", "float16")],
        states={"key_cache_0": (1, 8, 4096, 64)},
    )  # fmt: skip
    warnings = known_faults({"main": graph})
    assert len(warnings) == 4
    argmax, exp, positions, write = warnings
    assert "'argmax_9'" in argmax and "iPhone 17 Pro" in argmax
    assert "1 fp16 exp/softplus op(s) (first 'exp_3')" in exp  # the fp32 exp is safe
    assert "a state of 4096 positions" in positions and "2,048" in positions
    assert "'write_k'" in write and "runtime index" in write


def test_a_program_with_none_of_them_has_no_warning() -> None:
    short = _graph([("exp", "exp_1", "float32")], states={"key_cache_0": (1, 8, 2048, 64)})
    assert known_faults({"main": short}) == []


def test_the_projects_core_ai_builds_meet_no_known_fault(coreai_assets: dict[str, Path]) -> None:
    from decodebench.analysis.analyze import analyze_graphs

    for asset in coreai_assets.values():
        assert known_faults(analyze_graphs(asset, "coreai")[1]) == []
