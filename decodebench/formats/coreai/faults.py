"""Faults Core AI is known to have on iPhones (open issues in Apple's repositories, iOS 27
betas), found in a program before a phone runs it: each warning names the op and the cause.

- an ``argmax`` inside the graph is wrong with hardware acceleration on iPhone 17 Pro (the
  project's builds return logits and take the argmax on the host);
- fp16 ``exp`` / ``softplus`` overflow on the Neural Engine (finite on the engine here, and
  on the CPU, infinite there);
- a K/V state bound past 2,048 positions corrupts the decode output on iOS, and a KV write at
  an index known only at run time crashed early betas: both concern states and runtime-index
  writes into them (the project's builds keep K/V as inputs the host writes).

The emulated phone cannot reproduce any of them; the warnings travel with the build's report.
"""

from __future__ import annotations

from decodebench.analysis.graph import Graph

STATE_POSITIONS_LIMIT = 2048
OVERFLOWING_FP16 = ("exp", "softplus")
STATE_WRITES = ("slice_update", "scatter", "scatter_nd", "dynamic_update_slice")


def _first(graph: Graph, kinds: tuple[str, ...], fp16: bool = False) -> tuple[str, int] | None:
    found = [
        op
        for op in graph.operations
        if op.type in kinds
        and (not fp16 or any(graph.types[name].dtype == "float16" for name in op.outputs))
    ]
    return (found[0].name, len(found)) if found else None


def known_faults(functions: dict[str, Graph]) -> list[str]:
    """A warning per known fault the program's functions would meet on an iPhone, naming the
    op."""
    warnings: list[str] = []
    for name, graph in sorted(functions.items()):
        if hit := _first(graph, ("argmax",)):
            warnings.append(
                f"{name}: {hit[1]} argmax op(s) in the graph (first {hit[0]!r}): Core AI's "
                "in-graph argmax is wrong with hardware acceleration on iPhone 17 Pro; return "
                "logits and take the argmax on the host"
            )
        if hit := _first(graph, OVERFLOWING_FP16, fp16=True):
            warnings.append(
                f"{name}: {hit[1]} fp16 exp/softplus op(s) (first {hit[0]!r}): they overflow on "
                "the Neural Engine in iOS 27 betas; compute them in fp32 or prefer the GPU"
            )
        states = [t for t in graph.inputs.values() if t.state and t.shape]
        longest = max((max(t.shape or (0,)) for t in states), default=0)
        if longest > STATE_POSITIONS_LIMIT:
            warnings.append(
                f"{name}: a state of {longest} positions: decode output is corrupt once a bound "
                f"KV state passes {STATE_POSITIONS_LIMIT:,} positions on iOS 27"
            )
        if states and (hit := _first(graph, STATE_WRITES)):
            warnings.append(
                f"{name}: {hit[1]} write(s) into a state (first {hit[0]!r}): KV writes at a "
                "runtime index crashed early iOS 27 betas"
            )
    return warnings
