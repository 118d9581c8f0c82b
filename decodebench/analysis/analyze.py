"""Static analysis of a saved ``.mlpackage``: op histogram, data moved per token, predicted tok/s.

Reads the program protobuf (``Data/<root model>``); of the weights file only its size and a
few tiny constants (see :mod:`decodebench.analysis.mlpackage`) are read. Sizes come from the MIL types, so nothing is executed, and any
ML program can be analysed, including ones this project did not build: op types coremltools
does not register are counted and listed in ``unknown_ops``, never fatal.

``bytes_per_token`` is a first-order model of one decode step (``docs/architecture.md``, and
:mod:`decodebench.analysis.traffic` for what each category counts); ``predicted_tok_s`` applies each
device profile's bandwidth and per-op dispatch overhead to it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from decodebench.analysis.copies import redundant_copies
from decodebench.analysis.known_ops import KNOWN_OPS
from decodebench.analysis.mlpackage import (
    AnalysisError,
    FunctionGraph,
    decode_function_name,
    function_graphs,
    load_program,
    value_bytes,
    value_dtype,
    value_shape,
)
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
    TensorRecord,
)

__all__ = [
    "ANALYSIS_VERSION",
    "AnalysisError",
    "analyze_mlpackage",
    "load_program",
]

# 1: the first cut (tiles only, whole weights, no dispatch term). 2: this module.
ANALYSIS_VERSION = 2


def _directory_bytes(directory: Path) -> int:
    if not directory.is_dir():
        return 0
    return sum(item.stat().st_size for item in directory.rglob("*") if item.is_file())


def _function_ops(graph: FunctionGraph) -> FunctionOps:
    counts = Counter(operation.type for operation in graph.operations)
    return FunctionOps(
        ops_total=sum(counts.values()),
        non_const_ops=sum(counts.values()) - counts.get("const", 0),
        dispatch_ops=dispatch_ops(graph),
        op_counts=dict(counts.most_common()),
    )


def _weight_storage(graphs: Iterable[FunctionGraph]) -> tuple[int, dict[str, int], dict[str, int]]:
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


def analyze_mlpackage(path: Path | str) -> GraphAnalysis:
    """Analyse a saved ``.mlpackage`` without loading its weights or running it."""
    spec, model_directory = load_program(path)
    graphs = function_graphs(spec, model_directory)
    decode_name = decode_function_name(spec)
    if decode_name is None:
        raise AnalysisError(f"{path} is an mlprogram without functions")
    decode = graphs[decode_name]
    operations = [operation for graph in graphs.values() for operation in graph.operations]
    op_counts = Counter(operation.type for operation in operations)

    tiles = [
        TensorRecord(
            name=named.name,
            shape=value_shape(named.type) or [],
            dtype=value_dtype(named.type),
            bytes=value_bytes(named.type),
        )
        for operation in operations
        if operation.type == "tile"
        for named in operation.outputs
    ]
    copies = redundant_copies(decode)
    kv = kv_traffic(decode)
    weight_bytes, by_encoding, by_dtype = _weight_storage(graphs.values())
    weights_read = weight_bytes_read(decode)
    redundant = sum(copy.moved_bytes for copy in copies)
    read_states = [state for state in kv.states if state.read]
    return GraphAnalysis(
        analysis_version=ANALYSIS_VERSION,
        functions=sorted(graphs),
        decode_function=decode_name,
        function_ops={name: _function_ops(graph) for name, graph in graphs.items()},
        ops_total=sum(op_counts.values()),
        non_const_ops=sum(op_counts.values()) - op_counts.get("const", 0),
        dispatch_ops=dispatch_ops(decode),
        op_counts=dict(op_counts.most_common()),
        unknown_ops={op: count for op, count in op_counts.items() if op not in KNOWN_OPS},
        tile_ops=op_counts.get("tile", 0),
        tile_output_bytes=sum(tile.bytes for tile in tiles),
        tiles=tiles,
        redundant_ops=copies,
        redundant_output_bytes=sum(copy.bytes for copy in copies),
        slice_update_ops=op_counts.get("slice_update", 0),
        state_write_ops=kv.state_write_ops,
        state_write_bytes=kv.state_write_bytes,
        state_read_ops=op_counts.get("read_state", 0),
        weight_bytes=weight_bytes,
        weight_file_bytes=_directory_bytes(model_directory / "weights"),
        weight_bytes_by_encoding=by_encoding,
        weight_bytes_by_dtype=by_dtype,
        kv_source=kv.source,
        state_bytes=sum(state.bytes for state in kv.states),
        states=kv.states,
        bytes_per_token=BytesPerToken(
            weights=weights_read,
            kv_read=kv.read_bytes,
            kv_write=kv.write_bytes,
            redundant=redundant,
            total=weights_read + kv.read_bytes + kv.write_bytes + redundant,
            kv_read_per_position=sum(state.bytes_per_position for state in read_states),
            kv_positions=max((state.positions for state in read_states), default=0),
        ),
    )


def render_analysis(analysis: GraphAnalysis, title: str) -> str:
    """The text report of ``decodebench analyze``."""
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
        f"    kv read          {moved.kv_read / mib:10.2f} MiB at full context "
        f"({moved.kv_positions} positions; {moved.kv_read_per_position:,} bytes per position)",
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
    if analysis.unknown_ops:
        unknown = ", ".join(f"{op} {count}" for op, count in sorted(analysis.unknown_ops.items()))
        lines.append(f"  unknown ops        {unknown}")
    lines.append("  op histogram")
    for op_type, count in sorted(analysis.op_counts.items(), key=lambda item: (-item[1], item[0])):
        lines.append(f"    {op_type:28s} {count}")
    return "\n".join(lines)
