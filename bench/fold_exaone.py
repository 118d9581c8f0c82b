"""Fold the full EXAONE 4.0 1.2B repeat_kv build and compare it with the natively folded build.

Builds both attention layouts at the full shape (random weights, context 4096 by default) with
``build_variant``, runs the GQA fold pass on the repeat_kv package (``decodebench fold``), and
checks that all 60 tiles are gone and that the folded package's analysis equals the native
fold's: the same op histogram, the same op count, the same bytes per token. It then decodes
``--verify-steps`` tokens (4 by default, 0 to skip) from prompt [1] with the repeat_kv and the
pass-folded packages in the reference interpreter and requires identical greedy tokens; the
output names the number of steps verified.

Each stage runs in its own process; its wall time and peak RSS are printed (the two builds are
``build_variant`` fp16 builds, each with its finite check).

    nice -n 10 flock /tmp/decodebench-bench.lock python -m bench.fold_exaone [--context 4096]
        [--keep DIR] [--verify-steps N]
    python -m bench.fold_exaone --model tiny-gqa --context 64   # seconds
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from decodebench.building.build import PACKAGE_NAME, build_variant, load_report
from decodebench.contracts.domain import Attention, VariantSpec
from decodebench.contracts.presets import EXAONE_4_0_1_2B, get_preset

MIB = 1024**2
GIB = 1024**3
FOLD_REPORT = "fold.json"
VERIFY_REPORT = "verify.json"


def peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB


def child(stage: str, root: Path, model: str, context: int, steps: int) -> None:
    if stage in (Attention.repeat_kv.value, Attention.folded.value):
        variant = VariantSpec(attention=Attention(stage), context=context)
        build_variant(model, variant, root / stage)
    elif stage == "fold":
        from decodebench.formats.coreml.fold_package import fold_mlpackage
        from decodebench.formats.coreml.program import quiet_coremltools

        started = time.perf_counter()
        with quiet_coremltools():
            report = fold_mlpackage(
                root / "repeat_kv" / PACKAGE_NAME, root / "pass_folded.mlpackage"
            )
        payload = report.model_dump(mode="json")
        payload["seconds"] = round(time.perf_counter() - started, 1)
        payload["peak_rss_gib"] = round(peak_rss_gib(), 2)
        (root / FOLD_REPORT).write_text(json.dumps(payload))
    elif stage == "verify":
        from decodebench.formats.coreml.program import quiet_coremltools
        from decodebench.formats.coreml.verify import verify_packages

        started = time.perf_counter()
        with quiet_coremltools():
            result = verify_packages(
                root / "repeat_kv" / PACKAGE_NAME, root / "pass_folded.mlpackage", steps, prompt=[1]
            )
        payload = result.model_dump(mode="json")
        payload["seconds"] = round(time.perf_counter() - started, 1)
        payload["peak_rss_gib"] = round(peak_rss_gib(), 2)
        (root / VERIFY_REPORT).write_text(json.dumps(payload))


def run_child(stage: str, root: Path, model: str, context: int, steps: int) -> None:
    command = [
        sys.executable,
        "-m",
        "bench.fold_exaone",
        "--child",
        stage,
        "--out",
        str(root),
        "--model",
        model,
    ]
    command += ["--context", str(context), "--verify-steps", str(steps)]
    started = time.perf_counter()
    process = subprocess.Popen(command)
    _, status, usage = os.wait4(process.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"stage {stage} failed ({status})")
    print(
        f"[{stage}] {time.perf_counter() - started:.1f} s, "
        f"peak RSS {usage.ru_maxrss * 1024 / GIB:.2f} GiB",
        flush=True,
    )


def summarize(label: str, analysis: dict) -> None:
    moved = analysis["bytes_per_token"]
    print(f"== {label}")
    print(f"  ops                {analysis['ops_total']} ({analysis['non_const_ops']} non-const)")
    print(
        f"  tile ops           {analysis['tile_ops']} ({analysis['tile_output_bytes'] / MIB:.1f} MiB)"
    )
    print(
        f"  bytes per token    {moved['total']:,} (weights {moved['weights'] / MIB:.1f} MiB, "
        f"kv read {moved['kv_read'] / MIB:.1f} MiB, redundant {moved['redundant'] / MIB:.1f} MiB)"
    )
    rates = ", ".join(f"{d} {r:.2f} tok/s" for d, r in analysis.get("predicted_tok_s", {}).items())
    print(f"  predicted          {rates}")


def main() -> int:
    parser = argparse.ArgumentParser(description="Fold EXAONE 1.2B repeat_kv, compare with native")
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--model", default=EXAONE_4_0_1_2B.name, help="preset (tiny-gqa to try it)")
    parser.add_argument("--keep", type=Path, help="work here and keep the packages")
    parser.add_argument(
        "--verify-steps", type=int, default=4, help="decode N tokens in both (0: skip)"
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.out, args.model, args.context, args.verify_steps)
        return 0

    config = get_preset(args.model)
    layers = config.num_layers
    # One fp16 K and one V tile per layer, each [1, Hq, context, head_dim].
    tile_bytes = 2 * layers * config.num_attention_heads * args.context * config.head_dim * 2
    with tempfile.TemporaryDirectory(prefix="fold-exaone-") as scratch:
        root = args.keep or Path(scratch)
        root.mkdir(parents=True, exist_ok=True)
        stages = ["repeat_kv", "folded", "fold"] + (["verify"] if args.verify_steps else [])
        for stage in stages:
            run_child(stage, root, args.model, args.context, args.verify_steps)
        native = load_report(root / "folded").analysis.model_dump(mode="json")
        fold = json.loads((root / FOLD_REPORT).read_text())
        before, after = fold["before"], fold["after"]
        summarize("repeat_kv (build_variant)", before)
        summarize("repeat_kv folded by decodebench::fold_gqa", after)
        summarize("folded natively (build_variant)", native)
        patterns = fold["fold"]["patterns"]
        rewritten = [p for p in patterns if p["status"] == "rewritten"]
        print("== fold")
        print(
            f"  patterns           {len(patterns)} found, {len(rewritten)} rewritten, "
            f"{len(patterns) - len(rewritten)} refused; mappings "
            f"{sorted({p['head_mapping'] for p in rewritten})}"
        )
        print(f"  removed ops        {fold['fold']['removed_ops']}")
        print(f"  fold stage         {fold['seconds']} s, peak RSS {fold['peak_rss_gib']} GiB")
        differing = {
            op: (after["op_counts"].get(op), native["op_counts"].get(op))
            for op in set(after["op_counts"]) | set(native["op_counts"])
            if after["op_counts"].get(op) != native["op_counts"].get(op)
        }
        checks = {
            f"repeat_kv has {2 * layers} tiles ({tile_bytes / MIB:.0f} MiB)": before["tile_ops"]
            == 2 * layers
            and before["tile_output_bytes"] == tile_bytes,
            f"all {layers} attentions rewritten, none refused": len(rewritten)
            == len(patterns)
            == layers,
            f"all {2 * layers} tiles removed": after["tile_ops"] == 0
            and fold["fold"]["removed_ops"].get("tile") == 2 * layers,
            "op histogram equals the native fold": not differing,
            "op count equals the native fold": after["ops_total"] == native["ops_total"],
            "bytes per token equal the native fold": after["bytes_per_token"]
            == native["bytes_per_token"],
        }
        if differing:
            print(f"  op counts differing (pass, native): {differing}")
        if args.verify_steps:
            verify = json.loads((root / VERIFY_REPORT).read_text())
            print(
                f"== verify (reference interpreter, repeat_kv vs pass-folded, "
                f"{verify['steps']} steps from prompt [1])"
            )
            print(f"  tokens             {verify['tokens_a']} vs {verify['tokens_b']}")
            print(f"  max |logit diff|   {verify['max_abs_diff']:.3g}")
            print(
                f"  verify stage       {verify['seconds']} s, peak RSS {verify['peak_rss_gib']} GiB"
            )
            checks[f"greedy tokens identical over {verify['steps']} verified steps"] = verify[
                "agree"
            ]
        print("== checks")
        for description, passed in checks.items():
            print(f"  [{'ok' if passed else 'FAIL'}] {description}")
        return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
