"""Every avoidable byte a decode step moves that the analysis recognises, with its fix.

Each :class:`Waste` says what moves, how many bytes per token it costs, the fix, and the
predicted tok/s per device class with those bytes gone (the analysis's one prediction,
:meth:`decodebench.contracts.profiles.DeviceProfile.predicted_tok_s`, on the total minus them):

- **tiles and repeats** of a KV cache (counted by the analysis): fold the query instead
  (``decodebench fold``, applied by ``decodebench repair``);
- **other pure copies** (tiles of anything else, transposes, broadcasts): fold them into their
  reader;
- **KV cache as inputs/outputs**: a cache input passed out again whole, updated, is written
  whole every step where a state is written one position (both are read whole: attention reads
  the cache); the fix (Core ML states) needs the conversion's ``states=`` and a decode loop that
  keeps an ``MLState``, so it cannot be applied to the package alone;
- **fp32 islands**: values cast from fp16 to fp32, computed on and cast back; each fp32 value
  moves twice the bytes. Fix: compute in fp16 (for a norm, the overflow-safe rewrite);
- **full-context masks**: a mask input as long as the cache, passed every step; fix: build it in
  the graph from the position;
- **lm_head dominating the weights** (over a quarter of the bytes read): palettize it to 6 bits.

A Core AI program (``.aimodel``) gets the fixes its own build offers: the fold is a rebuild with
``--attention folded`` (``repair`` rewrites Core ML packages only), and the cache's fix is Core
AI states, which the project does not build yet.

Everything is read from the program's protobuf, as the analysis reads it (the weights stay on
disk); :func:`decodebench.analysis.analyze.analyze_graphs` hands over what it parsed.
"""

from __future__ import annotations

from collections.abc import Sized
from pathlib import Path

from decodebench.analysis.analyze import analyze_graphs, format_of
from decodebench.analysis.graph import Graph
from decodebench.contracts.analysis import GraphAnalysis
from decodebench.contracts.doctor import Waste
from decodebench.contracts.profiles import DEVICE_PROFILES
from decodebench.formats import get_format

LM_HEAD_SHARE = 0.25
PALETTE_BITS = 6
REPLICATIONS = ("tile", "broadcast_in_dims", "repeat_concat", "repeat_gather")
FLOATS = ("float16", "float32")
# Fixes that differ by format: (the fix, whether ``decodebench repair`` applies it).
FIXES: dict[str, dict[str, tuple[str, bool]]] = {
    "coreml": {
        "replicas": (
            "fold the query instead of replicating K/V heads (decodebench fold / repair)",
            True,
        ),
        "cache io": (
            "make the caches Core ML states (convert with states=..., iOS 18) and keep an "
            "MLState in the decode loop: only the new K/V slice is written",
            False,
        ),
    },
    "coreai": {
        "replicas": (
            "fold the query instead of replicating K/V heads (rebuild with decodebench build "
            "--format coreai --attention folded)",
            False,
        ),
        "cache io": (
            "keep the caches as Core AI states (state_names=..., iOS 27), written one position "
            "a step; decodebench does not build Core AI states yet",
            False,
        ),
    },
}


def _after(analysis: GraphAnalysis, saved: int) -> dict[str, float]:
    total = max(analysis.bytes_per_token.total - saved, 1)
    return {
        name: profile.predicted_tok_s(total, analysis.dispatch_ops)
        for name, profile in DEVICE_PROFILES.items()
    }


def _count(items: Sized, one: str, many: str = "") -> str:
    return f"{len(items)} {one if len(items) == 1 else many or one + 's'}"


def _is_computed(graph: Graph, name: str) -> bool:
    producer = graph.producers.get(name)
    return producer is None or (
        producer.type != "const" and not producer.type.startswith("constexpr_")
    )


def find_waste(
    path: Path | str,
    analysis: GraphAnalysis | None = None,
    graphs: dict[str, Graph] | None = None,
    format_name: str | None = None,
) -> list[Waste]:
    """The avoidable bytes of the package at ``path``, read from its graph (weights stay on
    disk). Pass the ``analysis`` and the ``graphs`` :func:`analyze_graphs` returned to read the
    program once. The format is the one ``path`` names unless ``format_name`` says."""
    format_name = format_name or format_of(path)
    fixes = FIXES.get(format_name, FIXES["coreml"])
    if analysis is None:
        analysis, graphs = analyze_graphs(path, format_name)
    elif graphs is None:
        graphs = get_format(format_name).read_graph(Path(path)).functions
    graph = graphs.get(analysis.decode_function) or next(iter(graphs.values()))
    found: list[Waste] = []

    def add(kind: str, what: str, saved: int, fix: str, applicable: bool = False) -> None:
        if saved > 0:
            after = _after(analysis, saved)
            found.append(Waste(kind=kind, what=what, bytes_per_token=saved, fix=fix,
                               applicable=applicable, predicted_tok_s_after=after))  # fmt: skip

    # A replica of a KV cache is the fold's (repair applies it); any other copy, a RoPE table
    # concatenated with itself say, is for the source to avoid.
    caches = {state.name for state in analysis.states}
    copies = analysis.redundant_ops
    replicated = [copy.kind in REPLICATIONS and copy.source in caches for copy in copies]
    replicas = [copy for copy, kv in zip(copies, replicated, strict=True) if kv]
    others = [copy for copy, kv in zip(copies, replicated, strict=True) if not kv]
    add(
        "tiles and repeats",
        f"{_count(replicas, 'tile / repeat copy', 'tile / repeat copies')} of the KV cache",
        sum(copy.moved_bytes for copy in replicas),
        *fixes["replicas"],
    )
    kinds = ", ".join(sorted({copy.kind for copy in others}))
    add(
        "pure copies",
        f"{_count(others, 'copy', 'copies')} ({kinds}) written and read again",
        sum(copy.moved_bytes for copy in others),
        "fold each into the op reading it (in the model source)",
    )
    outputs = graph.outputs
    inputs_passed_out, crossing = _caches_passed_out(analysis, graph)
    add(
        "KV cache as I/O",
        f"{_count(inputs_passed_out, 'cache input')} passed out again whole, updated, every step",
        crossing,
        *fixes["cache io"],
    )
    widened = _widened(graph)
    add(
        "fp32 islands",
        f"{_count(widened, 'fp16 value')} widened to fp32 and computed on",
        # Each fp32 copy is twice its fp16 bytes: the extra half written and read again.
        sum(graph.bytes_of(name) for name in widened),
        "compute in fp16 where the headroom allows (norms: the overflow-safe rewrite)",
    )
    context = max((state.positions for state in analysis.states), default=0)
    masks = _context_masks(graph, caches, context)
    add(
        "full-context masks",
        f"{_count(masks, 'mask input')} of {context} positions every step",
        sum(graph.bytes_of(name) for name in masks),
        "build the mask in the graph from the position input",
    )
    heads = _output_linear_weights(graph, outputs)
    head_bytes = sum(graph.bytes_of(name) for name in heads)
    weights = max(analysis.bytes_per_token.weights, 1)
    if head_bytes / weights > LM_HEAD_SHARE:
        bits = graph.tensor(heads[0]).bits
        add(
            "lm_head dominates",
            f"the lm_head is {head_bytes / weights:.0%} of the weight bytes",
            int(head_bytes * (1 - PALETTE_BITS / bits)),
            f"palettize the lm_head to {PALETTE_BITS} bits",
        )
    return found


def _caches_passed_out(analysis: GraphAnalysis, graph: Graph) -> tuple[list[str], int]:
    """The cache inputs returned whole, and the bytes they cross beyond one position each.

    A cache input returned whole (an output of its shape, paired in order) is written whole
    every step; a state would be written one position. The read stays: attention needs it.
    """
    inputs_passed_out: list[str] = []
    crossing = 0
    taken: set[str] = set()
    for state in analysis.states if analysis.kv_source == "inputs" else []:
        shape = graph.shape_of(state.name)
        out = next(
            (o for o in graph.outputs if o not in taken and graph.shape_of(o) == shape), None
        )
        if shape is not None and out is not None:
            taken.add(out)
            inputs_passed_out.append(state.name)
            crossing += graph.bytes_of(out) - state.bytes_per_position
    return inputs_passed_out, crossing


def _widened(graph: Graph) -> list[str]:
    """The fp32 values cast from computed fp16 ones."""
    return [
        operation.outputs[0]
        for operation in graph.operations
        if operation.type == "cast"
        and (source := graph.argument_name(operation, "x")) is not None
        and _is_computed(graph, source)
        and graph.tensor(source).dtype == "float16"
        and graph.tensor(operation.outputs[0]).dtype == "float32"
    ]


def _context_masks(graph: Graph, caches: set[str], context: int) -> list[str]:
    """The float inputs, not caches, whose last axis spans the whole context."""
    return [
        name
        for name, tensor in graph.inputs.items()
        if context
        and name not in caches
        and not tensor.state
        and tensor.dtype in FLOATS
        and len(shape := graph.shape_of(name) or []) >= 2
        and shape[-1] == context
    ]


def _output_linear_weights(graph: Graph, outputs: list[str]) -> list[str]:
    """The weights of the ``linear`` ops making an output (the lm_head)."""
    return [
        name
        for operation in graph.operations
        if operation.type == "linear"
        and any(out in outputs for out in operation.outputs)
        and (name := graph.argument_name(operation, "weight")) is not None
    ]


def _size(count: int) -> str:
    return f"{count / 2**20:,.2f} MiB" if count >= 2**20 else f"{count / 2**10:,.1f} KiB"


def render(found: list[Waste], analysis: GraphAnalysis) -> list[str]:
    """Each waste on a line (kind, what, bytes per token), then its fix and whether
    ``decodebench repair`` applies it, then the predicted tok/s per device class after it."""
    lines = [f"avoidable bytes per token (of {analysis.bytes_per_token.total / 2**20:,.1f} MiB)"]
    if not found:
        lines.append("  none recognised")
    now = analysis.predicted_tok_s()
    for waste in found:
        rates = ", ".join(
            f"{device} {now.get(device, 0):.1f} -> {rate:.1f}"
            for device, rate in waste.predicted_tok_s_after.items()
        )
        repair = (
            "decodebench repair applies it" if waste.applicable else "not by decodebench repair"
        )
        lines += [
            f"  {waste.kind}: {waste.what}: {_size(waste.bytes_per_token)}/token",
            f"    fix ({repair}): {waste.fix}",
            f"    predicted tok/s after the fix: {rates}",
        ]
    return lines
