"""Static analysis of a saved ``.mlpackage``: op histogram, data moved per token, predicted tok/s.

Reads the program protobuf (``Data/<root model>``); of the weights file only its size and a
few tiny constants (see :mod:`decodebench.formats.coreml.graph`) are read. Sizes come from the MIL types, so nothing is executed, and any
ML program can be analysed, including ones this project did not build: op types coremltools
does not register are counted and listed in ``unknown_ops``, never fatal.

``bytes_per_token`` is a first-order model of one decode step (``docs/architecture.md``, and
:mod:`decodebench.analysis.traffic` for what each category counts); ``predicted_tok_s`` applies each
device profile's bandwidth and per-op dispatch overhead to it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path

from decodebench.analysis.copies import is_replication, redundant_copies
from decodebench.analysis.graph import AnalysisError, Graph, ProgramGraph
from decodebench.analysis.traffic import (
    dispatch_ops,
    kv_traffic,
    stored_weights,
    weight_bytes_read,
)
from decodebench.contracts.analysis import (
    BytesPerToken,
    FunctionOps,
    GraphAnalysis,
    KvState,
    SlidingWindow,
    TensorRecord,
)
from decodebench.contracts.names import (
    METADATA_CONTEXT,
    METADATA_SLIDING_CACHES,
    METADATA_SLIDING_WINDOW,
)
from decodebench.formats import get_format

__all__ = [
    "ANALYSIS_VERSION",
    "AnalysisError",
    "analyze_graphs",
    "analyze_mlpackage",
]

# 1: the first cut (tiles only, whole weights, no dispatch term). 2: this module. 3: sliding
# windows (the caches of sliding layers and what a ring of the window would move).
ANALYSIS_VERSION = 3


def _function_ops(graph: Graph) -> FunctionOps:
    counts = Counter(operation.type for operation in graph.operations)
    return FunctionOps(
        ops_total=sum(counts.values()),
        non_const_ops=sum(counts.values()) - counts.get("const", 0),
        dispatch_ops=dispatch_ops(graph),
        op_counts=dict(counts.most_common()),
    )


def _weight_storage(graphs: Iterable[Graph]) -> tuple[int, dict[str, int], dict[str, int]]:
    """Stored weight bytes of the whole program (each blob once), by encoding and by dtype."""
    seen: set[tuple[str, ...]] = set()
    by_encoding: Counter[str] = Counter()
    by_dtype: Counter[str] = Counter()
    for graph in graphs:
        for weight in stored_weights(graph):
            if weight.key in seen:
                continue
            seen.add(weight.key)
            by_encoding[weight.encoding] += weight.bytes
            by_dtype[weight.dtype] += weight.bytes
    return sum(by_encoding.values()), dict(by_encoding), dict(by_dtype)


def _sliding_layers(metadata: Mapping[str, str]) -> tuple[int, set[str], int | None]:
    """The window, the caches of sliding layers and the context a build wrote in its metadata
    (nothing for a program made elsewhere: its graph does not say which layers slide)."""
    try:
        window = int(metadata.get(METADATA_SLIDING_WINDOW, "0"))
        context = int(metadata[METADATA_CONTEXT]) if METADATA_CONTEXT in metadata else None
    except ValueError:
        return 0, set(), None
    names = {name for name in metadata.get(METADATA_SLIDING_CACHES, "").split(",") if name}
    return (window, names, context) if window > 0 and names else (0, set(), None)


def _with_windows(
    states: list[KvState], metadata: Mapping[str, str]
) -> tuple[list[KvState], int, int | None]:
    window, names, context = _sliding_layers(metadata)
    marked = [
        state.model_copy(update={"window": window}) if state.name in names else state
        for state in states
    ]
    return marked, window, context


def sliding_window_saving(
    states: list[KvState], window: int, context: int | None, moved: BytesPerToken
) -> SlidingWindow | None:
    """Bytes per token of this build with full-context caches and with sliding layers' caches
    holding their window only (None without sliding layers)."""
    sliding = [state for state in states if state.window]
    if not window or not sliding:
        return None
    context = context or max(state.positions for state in states)
    others = moved.total - moved.kv_read
    return SlidingWindow(
        window=window,
        context=context,
        sliding_caches=len(sliding),
        caches=len(states),
        windowed=any(state.positions < context for state in sliding),
        full_context_bytes=others + sum(state.read_over(context, False) for state in states),
        windowed_bytes=others + sum(state.read_over(context, True) for state in states),
    )


def analyze_mlpackage(path: Path | str, format_name: str | None = None) -> GraphAnalysis:
    """Analyse a saved package (of the format its name says: ``.aimodel`` is Core AI, else
    Core ML) without loading its weights or running it."""
    return analyze_graphs(path, format_name)[0]


def format_of(path: Path | str) -> str:
    """The format a package's name says: ``.aimodel`` is Core AI, anything else Core ML."""
    return "coreai" if Path(path).suffix == ".aimodel" else "coreml"


def analyze_graphs(
    path: Path | str, format_name: str | None = None
) -> tuple[GraphAnalysis, dict[str, Graph]]:
    """The analysis and the function graphs it read, for a caller that reads them further
    (:func:`decodebench.doctor.waste.find_waste`) without parsing the program again."""
    program = get_format(format_name or format_of(path)).read_graph(Path(path))
    return analyze_program(program), program.functions


def analyze_program(program: ProgramGraph) -> GraphAnalysis:
    """The analysis of a program any format read into the neutral graph."""
    graphs = program.functions
    decode_name = program.decode_function
    decode = graphs[decode_name]
    operations = [operation for graph in graphs.values() for operation in graph.operations]
    op_counts = Counter(operation.type for operation in operations)

    tiles = [
        TensorRecord(
            name=name,
            shape=list(graph.tensor(name).shape or ()),
            dtype=graph.tensor(name).dtype,
            bytes=graph.bytes_of(name),
        )
        for graph in graphs.values()
        for operation in graph.operations
        if is_replication(graph, operation)
        for name in operation.outputs
    ]
    copies = redundant_copies(decode)
    kv = kv_traffic(decode)
    weight_bytes, by_encoding, by_dtype = _weight_storage(graphs.values())
    weights_read = weight_bytes_read(decode)
    redundant = sum(copy.moved_bytes for copy in copies)
    metadata = program.metadata
    states, window, context = _with_windows(kv.states, metadata)
    read_states = [state for state in states if state.read]
    moved = BytesPerToken(
        weights=weights_read,
        kv_read=kv.read_bytes,
        kv_write=kv.write_bytes,
        redundant=redundant,
        total=weights_read + kv.read_bytes + kv.write_bytes + redundant,
        kv_read_per_position=sum(state.bytes_per_position for state in read_states),
        kv_positions=max((state.positions for state in read_states), default=0),
    )
    analysis = GraphAnalysis(
        analysis_version=ANALYSIS_VERSION,
        functions=sorted(graphs),
        decode_function=decode_name,
        function_ops={name: _function_ops(graph) for name, graph in graphs.items()},
        ops_total=sum(op_counts.values()),
        non_const_ops=sum(op_counts.values()) - op_counts.get("const", 0),
        dispatch_ops=dispatch_ops(decode),
        op_counts=dict(op_counts.most_common()),
        unknown_ops={op: count for op, count in op_counts.items() if op not in program.known_ops},
        tile_ops=len(tiles),
        tile_output_bytes=sum(tile.bytes for tile in tiles),
        tiles=tiles,
        redundant_ops=copies,
        redundant_output_bytes=sum(copy.bytes for copy in copies),
        slice_update_ops=op_counts.get("slice_update", 0),
        state_write_ops=kv.state_write_ops,
        state_write_bytes=kv.state_write_bytes,
        state_read_ops=op_counts.get("read_state", 0),
        weight_bytes=weight_bytes,
        weight_file_bytes=program.weight_file_bytes,
        weight_bytes_by_encoding=by_encoding,
        weight_bytes_by_dtype=by_dtype,
        kv_source=kv.source,
        state_bytes=sum(state.bytes for state in states),
        states=states,
        bytes_per_token=moved,
        sliding_window=sliding_window_saving(states, window, context, moved),
    )
    return analysis


def render_analysis(analysis: GraphAnalysis, title: str, extra: Iterable[str] = ()) -> str:
    """The text report of ``decodebench analyze``; ``extra`` lines go before the op histogram."""
    mib = 1024**2
    moved = analysis.bytes_per_token
    lines = [
        title,
        f"  functions          {', '.join(analysis.functions)} (decode: {analysis.decode_function})",
        f"  ops total          {analysis.ops_total} ({analysis.dispatch_ops} dispatched per token)",
        f"  tile ops           {analysis.tile_ops} ({analysis.tile_output_bytes / mib:.1f} MiB)",
        f"  state-write ops    {analysis.state_write_ops} "
        f"({analysis.state_write_bytes:,} bytes per token)",
        f"  weight bytes       {analysis.weight_bytes:,} stored, "
        f"{analysis.weight_file_bytes:,} in the weight file",
    ]
    for encoding, size in sorted(analysis.weight_bytes_by_encoding.items()):
        lines.append(f"    {encoding:28s} {size / mib:10.2f} MiB")
    lines += [
        f"  bytes per token    {moved.total:,} ({moved.total / mib:.1f} MiB)",
        f"    weights          {moved.weights / mib:10.2f} MiB",
        f"    kv read          {moved.kv_read / mib:10.2f} MiB, every cache whole "
        f"(longest {moved.kv_positions} positions; {moved.kv_read_per_position:,} bytes per "
        "position over all caches)",
        f"    kv write         {moved.kv_write / mib:10.2f} MiB",
        f"    redundant        {moved.redundant / mib:10.2f} MiB "
        f"({len(analysis.redundant_ops)} copies, {analysis.redundant_output_bytes / mib:.1f} MiB "
        "written and read again)",
    ]
    for copy in analysis.redundant_ops:
        lines.append(
            f"      {copy.kind:13s} {copy.name} {copy.shape} {copy.dtype} "
            f"{copy.bytes / mib:.2f} MiB <- {copy.source_op} {copy.source}"
        )
    for device_class, rate in analysis.predicted_tok_s().items():
        lines.append(f"  predicted          {device_class}: {rate:.2f} tok/s")
    lines += _sliding_lines(analysis)
    if analysis.unknown_ops:
        unknown = ", ".join(f"{op} {count}" for op, count in sorted(analysis.unknown_ops.items()))
        lines.append(f"  unknown ops        {unknown}")
    lines += extra
    lines.append("  op histogram")
    for op_type, count in sorted(analysis.op_counts.items(), key=lambda item: (-item[1], item[0])):
        lines.append(f"    {op_type:28s} {count}")
    return "\n".join(lines)


def _sliding_lines(analysis: GraphAnalysis) -> list[str]:
    """The sliding-window saving: bytes per token and predicted tok/s of both cache layouts."""
    sliding = analysis.sliding_window
    if sliding is None:
        return []
    mib = 1024**2
    kept = "its window (kv_window)" if sliding.windowed else "the full context"
    layouts = analysis.predicted_layouts()
    lines = [
        f"  sliding window     {sliding.sliding_caches // 2} of {sliding.caches // 2} layers see "
        f"the last {sliding.window} of {sliding.context} positions; this build caches {kept}",
    ]
    for label, size, which in (
        ("full-context KV", sliding.full_context_bytes, 0),
        ("windowed KV", sliding.windowed_bytes, 1),
    ):
        rates = ", ".join(f"{device} {rates[which]:.2f}" for device, rates in layouts.items())
        lines.append(
            f"    {label:16s} {size:,} bytes per token ({size / mib:.1f} MiB); tok/s {rates}"
        )
    if sliding.full_context_bytes:
        share = sliding.saving / sliding.full_context_bytes
        speedup = sliding.full_context_bytes / sliding.windowed_bytes
        lines.append(
            f"    saving           {sliding.saving / mib:.1f} MiB per token ({share:.1%} of the "
            f"bytes), predicted {speedup:.3f}x tok/s"
        )
    return lines
