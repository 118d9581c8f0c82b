"""The waste of docs/architecture.md on the full EXAONE 4.0 1.2B shape: 60 tiles / 960 MiB with
repeat_kv, 0 folded.

Builds both attention layouts at context 4096 with random weights (each in its own process, so
the peak RSS printed is that build's), prints what the graph analysis finds, and exits non-zero
if the tile counts are not the expected ones. Each build is a ``build_variant`` fp16 build (with
its finite check), whose time and peak RSS are printed rather than assumed here.

    python -m bench.exaone_tiles [--context 4096] [--format coreml|coreai] [--keep DIR]

In Core AI (``--format coreai``) repeat_kv's copy is a ``broadcast_in_dims`` of each cache: the
same 60 copies and 960 MiB are checked among the replications the analysis counts (the new
token's K/V rows are replicated too, a few KiB each).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from decodebench.building.build import build_variant, load_report
from decodebench.contracts.build import BuildReport
from decodebench.contracts.domain import Attention, VariantSpec
from decodebench.contracts.presets import EXAONE_4_0_1_2B
from decodebench.doctor.waste import REPLICATIONS

MIB = 1024**2
GIB = 1024**3


def expected_tiles(context: int) -> tuple[int, int]:
    """Tile ops and their output bytes for repeat_kv: one K and one V tile per layer, fp16."""
    config = EXAONE_4_0_1_2B
    tile_bytes = config.num_attention_heads * context * config.head_dim * 2
    return 2 * config.num_layers, 2 * config.num_layers * tile_bytes


def build_in_child(
    attention: Attention, context: int, out_dir: Path, format_name: str = "coreml"
) -> BuildReport:
    command = [
        sys.executable,
        "-m",
        "bench.exaone_tiles",
        "--child",
        attention.value,
        "--context",
        str(context),
        "--format",
        format_name,
    ]
    started = time.perf_counter()
    subprocess.run([*command, "--out", str(out_dir)], check=True)
    print(
        f"[{attention.value}] process wall time {time.perf_counter() - started:.1f} s", flush=True
    )
    return load_report(out_dir)


def print_report(report: BuildReport) -> None:
    analysis = report.analysis
    moved = analysis.bytes_per_token
    stages = ", ".join(f"{stage} {seconds:.1f}s" for stage, seconds in report.stage_seconds.items())
    predictions = ", ".join(
        f"{device} {tok_s:.2f} tok/s" for device, tok_s in analysis.predicted_tok_s().items()
    )
    print(f"== {report.variant.label} ({report.model}, {report.config.num_layers} layers)")
    print(f"  tile ops           {analysis.tile_ops}")
    print(f"  tile output        {analysis.tile_output_bytes / MIB:.1f} MiB")
    print(
        f"  state-write ops    {analysis.state_write_ops} (slice_update {analysis.slice_update_ops})"
    )
    print(f"  ops                {analysis.ops_total} ({analysis.non_const_ops} non-const)")
    print(f"  weight bytes       {analysis.weight_bytes} ({analysis.weight_bytes / GIB:.3f} GiB)")
    print(f"  state bytes        {analysis.state_bytes / MIB:.1f} MiB")
    print(
        f"  bytes per token    {moved.total / MIB:.1f} MiB = weights {moved.weights / MIB:.1f}"
        f" + kv read {moved.kv_read / MIB:.1f} + kv write {moved.kv_write / 1024:.1f} KiB"
        f" + redundant {moved.redundant / MIB:.1f}"
    )
    print(f"  predicted          {predictions}")
    print(f"  stages             {stages}")
    print(f"  peak RSS           {report.peak_rss_bytes / GIB:.2f} GiB")
    replicas, replica_bytes = cache_replicas(report)
    print(f"  cache replicas     {replicas} ({replica_bytes / MIB:.1f} MiB)")
    if report.reference_check:
        print(f"  reference check    {report.reference_check}")


def cache_replicas(report: BuildReport) -> tuple[int, int]:
    """How many copies replicate a whole KV cache, and their bytes."""
    caches = {state.name for state in report.analysis.states}
    replicas = [
        copy
        for copy in report.analysis.redundant_ops
        if copy.kind in REPLICATIONS and copy.source in caches
    ]
    return len(replicas), sum(copy.bytes for copy in replicas)


def check(reports: dict[Attention, BuildReport], context: int) -> bool:
    tile_ops, tile_bytes = expected_tiles(context)
    repeated = reports[Attention.repeat_kv].analysis
    folded = reports[Attention.folded].analysis
    if reports[Attention.repeat_kv].variant.format != "coreml":
        replicas, replica_bytes = cache_replicas(reports[Attention.repeat_kv])
        checks = {
            f"repeat_kv replicates the caches {tile_ops} times": replicas == tile_ops,
            f"the replicas total {tile_bytes / MIB:.0f} MiB": replica_bytes == tile_bytes,
            "folded replicates no cache": cache_replicas(reports[Attention.folded]) == (0, 0),
            "same weights in both": repeated.weight_bytes == folded.weight_bytes,
        }
        return report_checks(checks)
    checks = {
        f"repeat_kv has {tile_ops} tiles": repeated.tile_ops == tile_ops,
        f"repeat_kv tiles total {tile_bytes / MIB:.0f} MiB": repeated.tile_output_bytes
        == tile_bytes,
        "folded has 0 tiles": folded.tile_ops == 0 and folded.tile_output_bytes == 0,
        "same weights in both": repeated.weight_bytes == folded.weight_bytes,
    }
    return report_checks(checks)


def report_checks(checks: dict[str, bool]) -> bool:
    for description, passed in checks.items():
        print(f"  [{'ok' if passed else 'FAIL'}] {description}")
    return all(checks.values())


def main() -> int:
    parser = argparse.ArgumentParser(description="EXAONE-shaped tile count, repeat_kv vs folded")
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--format", choices=["coreml", "coreai"], default="coreml")
    parser.add_argument("--keep", type=Path, help="build here and keep the packages")
    parser.add_argument("--child", choices=[a.value for a in Attention], help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.child:
        variant = VariantSpec(
            format=args.format, attention=Attention(args.child), context=args.context
        )
        build_variant(EXAONE_4_0_1_2B.name, variant, args.out)
        return 0

    with tempfile.TemporaryDirectory(prefix="exaone-tiles-") as scratch:
        root = args.keep or Path(scratch)
        reports = {}
        for attention in (Attention.repeat_kv, Attention.folded):
            out = root / attention.value
            reports[attention] = build_in_child(attention, args.context, out, args.format)
            print_report(reports[attention])
        print("== checks")
        return 0 if check(reports, args.context) else 1


if __name__ == "__main__":
    sys.exit(main())
