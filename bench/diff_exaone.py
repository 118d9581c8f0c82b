"""The graph diff on the full EXAONE 4.0 1.2B shape: repeat_kv (A) against folded (B).

Builds both attention layouts with the same quantization recipe at context 4096 (each in its
own process: ~5 GB of RAM and a minute or two per build), or takes two saved packages, and
prints the diff table. Then checks that the redundant difference is exactly the replicated KV
cache (2 tiles per layer, 60 in all, 960 MiB) and that the predicted speed-up follows from the
byte counts alone. Exits non-zero when a check fails.

Full-size builds take a lot of memory, and others run them too: take the shared lock,

    flock /tmp/decodebench-bench.lock python -m bench.diff_exaone [--keep DIR]
    python -m bench.diff_exaone --packages A.mlpackage B.mlpackage
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from decodebench.analysis.analyze import analyze_mlpackage
from decodebench.analysis.diff import GraphDiff, diff_analyses, render_diff
from decodebench.building.build import PACKAGE_NAME, build_variant
from decodebench.contracts.analysis import GraphAnalysis
from decodebench.contracts.domain import Attention, VariantSpec
from decodebench.contracts.presets import EXAONE_4_0_1_2B
from decodebench.contracts.profiles import DEVICE_PROFILES

MIB = 1024**2


def expected_tiles(context: int) -> tuple[int, int]:
    """repeat_kv: one K and one V tile per layer, each [1, Hkv, G, context, head_dim] fp16."""
    config = EXAONE_4_0_1_2B
    tile_bytes = config.num_attention_heads * context * config.head_dim * 2
    return 2 * config.num_layers, 2 * config.num_layers * tile_bytes


def build_in_child(attention: Attention, context: int, quant: str, out_dir: Path) -> Path:
    command = [
        sys.executable,
        "-m",
        "bench.diff_exaone",
        "--child",
        attention.value,
        "--context",
        str(context),
    ]
    started = time.perf_counter()
    subprocess.run([*command, "--quant", quant, "--out", str(out_dir)], check=True)
    print(f"[{attention.value}] built in {time.perf_counter() - started:.1f} s", flush=True)
    return out_dir / PACKAGE_NAME


def checks(diff: GraphDiff, a: GraphAnalysis, b: GraphAnalysis, context: int) -> dict[str, bool]:
    tile_ops, tile_bytes = expected_tiles(context)
    only_a = diff.redundant_only_in_a
    moved = diff.bytes_per_token
    byte_ratio = a.bytes_per_token.total / b.bytes_per_token.total
    bandwidth_only = all(profile.dispatch_overhead_us == 0 for profile in DEVICE_PROFILES.values())
    return {
        f"redundant only in A: exactly {tile_ops} tile ops": len(only_a) == tile_ops
        and all(copy.kind == "tile" for copy in only_a),
        f"... of {tile_bytes / MIB:.0f} MiB": diff.redundant_removed_bytes == tile_bytes,
        "... each copying a KV-cache state": all(copy.source_op == "read_state" for copy in only_a),
        "redundant only in B: none": not diff.redundant_only_in_b,
        f"redundant bytes per token fall by {2 * tile_bytes / MIB:.0f} MiB (write + read)": (
            moved["redundant"].delta == -2 * tile_bytes
        ),
        "weights, KV read and KV write unchanged": all(
            moved[category].delta == 0 for category in ("weights", "kv_read", "kv_write")
        ),
        f"bytes-alone speed-up = total A / total B = {byte_ratio:.3f}x": (
            diff.bytes_speedup == byte_ratio
        ),
        "predicted speed-up per device = the bytes-alone speed-up (profiles: bandwidth only)": (
            bandwidth_only
            and all(
                abs(prediction.speedup - byte_ratio) < 1e-9 * byte_ratio
                for prediction in diff.predicted.values()
            )
        ),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description="EXAONE-shaped graph diff, repeat_kv vs folded")
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument(
        "--quant", default="fp16", help="the recipe of both builds (fp16, base, top8, …)"
    )
    parser.add_argument("--keep", type=Path, help="build here and keep the packages")
    parser.add_argument("--packages", nargs=2, type=Path, metavar=("A", "B"),
                        help="diff these saved packages (repeat_kv, folded) instead of building")  # fmt: skip
    parser.add_argument("--child", choices=[a.value for a in Attention], help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    VariantSpec(quant=args.quant)  # refuse a bad recipe before building anything

    if args.child:
        variant = VariantSpec(
            attention=Attention(args.child), context=args.context, quant=args.quant
        )
        build_variant(EXAONE_4_0_1_2B.name, variant, args.out)
        return 0

    with tempfile.TemporaryDirectory(prefix="diff-exaone-") as scratch:
        if args.packages:
            package_a, package_b = args.packages
        else:
            root = args.keep or Path(scratch)
            package_a, package_b = (
                build_in_child(attention, args.context, args.quant, root / attention.value)
                for attention in (Attention.repeat_kv, Attention.folded)
            )
        started = time.perf_counter()
        a, b = analyze_mlpackage(package_a), analyze_mlpackage(package_b)
        diff = diff_analyses(a, b, labels=(str(package_a), str(package_b)))
        print(f"analysed and diffed in {time.perf_counter() - started:.2f} s")
    print(render_diff(diff))
    print("== checks")
    results = checks(diff, a, b, args.context)
    for description, passed in results.items():
        print(f"  [{'ok' if passed else 'FAIL'}] {description}")
    return 0 if all(results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
