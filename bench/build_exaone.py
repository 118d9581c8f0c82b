"""Full EXAONE 4.0 1.2B top8 build (ctx 4096, stateful KV): plain coremltools against ours.

Both run in the same invocation, each in its own process (wall time, CPU time and peak RSS of
that process alone, from wait4, interpreter start and imports included), on the same seeded
weights; the load average before and after each is printed, since the machine is shared:

- plain: per-layer sensitivity done the straightforward way (one full fp32 forward per layer),
  then ``torch.jit.trace``, ``ct.convert`` with the default pipeline, ``ct.optimize.coreml``
  palettization of the lm_head (6-bit, uniform: kmeans needs kmeans1d or scikit-learn) and
  linear quantization (int4/32, the 8 promoted layers int8 per channel), ``save``;
- ours: ``decodebench.build.build_variant`` with an empty cache (so the sensitivity is measured),
  then the same request again (cache hit).

    flock /tmp/decodebench-bench.lock python bench/build_exaone.py [--context 4096] [--top 8]
    python bench/build_exaone.py --model tiny-exaone --context 64 --top 1   # smoke run, seconds
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

GIB = 1024**3


def run_child(
    mode: str, out: Path, model_name: str, context: int, top: int
) -> tuple[float, int, dict]:
    command = [sys.executable, __file__, "--child", mode, "--out", str(out)]
    command += ["--model", model_name, "--context", str(context), "--top", str(top)]
    started = time.perf_counter()
    process = subprocess.Popen(command)
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - started
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{mode} build failed ({status})")
    details = json.loads((out / "bench.json").read_text())
    details["cpu_seconds"] = round(usage.ru_utime + usage.ru_stime, 1)
    return wall, usage.ru_maxrss * 1024, details


def plain(out: Path, model_name: str, context: int, top: int) -> dict:
    import coremltools as ct
    import numpy as np
    import torch
    from coremltools.optimize import coreml as cto

    from decodebench import coreml_compat
    from decodebench.convert import _input_types, _state_types
    from decodebench.modeling import build_model, step_inputs
    from decodebench.presets import get_preset
    from decodebench.quant.recipe import parse_recipe

    seconds: dict[str, float] = {}
    clock = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal clock
        seconds[name] = round(time.perf_counter() - clock, 1)
        clock = time.perf_counter()
        print(f"  [plain] {name} {seconds[name]}s", flush=True)

    config = get_preset(model_name)
    model = build_model(config, context, "folded", torch.float16)
    lap("build_model")
    recipe = parse_recipe(f"top{top}")
    promoted = naive_ranking(model, recipe)[:top]
    lap("sensitivity")

    coreml_compat.install()
    traced = coreml_compat.trace(model, step_inputs(0, 0, context, torch.float16))
    model.reset_cache()
    lap("trace")
    mlmodel = ct.convert(
        traced,
        inputs=_input_types(model),
        outputs=[ct.TensorType(name="logits", dtype=np.float16)],
        states=_state_types(model),
        convert_to="mlprogram",
        minimum_deployment_target=ct.target.iOS18,
        compute_precision=ct.precision.FLOAT16,
        skip_model_load=True,
    )
    del traced, model
    lap("convert")
    names = [
        op.name for op in mlmodel._mil_program.functions["main"].operations if op.op_type == "const"
    ]
    embed = [
        name
        for name in names
        if name.startswith("model_embed_tokens_weight")
        or name.startswith("model.embed_tokens.weight")
    ]
    palettized = cto.palettize_weights(
        mlmodel,
        cto.OptimizationConfig(
            op_name_configs={
                name: cto.OpPalettizerConfig(mode="uniform", nbits=6) for name in embed
            }
        ),
    )
    lap("palettize")
    int8 = cto.OpLinearQuantizerConfig(
        mode="linear_symmetric", dtype="int8", granularity="per_channel"
    )
    per_layer = {}
    for name in names:
        if "rope" in name:
            per_layer[name] = None
        for layer in promoted:
            if (
                name.startswith((f"model.layers.{layer}.", f"model_layers_{layer}_"))
                and "_proj" in name
            ):
                per_layer[name] = int8
    quantized = cto.linear_quantize_weights(
        palettized,
        cto.OptimizationConfig(
            global_config=cto.OpLinearQuantizerConfig(
                mode="linear_symmetric", dtype="int4", granularity="per_block", block_size=32
            ),
            op_name_configs=per_layer,
        ),
    )
    lap("linear_quantize")
    quantized.save(str(out / "model.mlpackage"))
    lap("save")
    return {"stage_seconds": seconds, "promoted": sorted(promoted)}


def naive_ranking(model: Any, recipe: Any) -> list[int]:
    """The straightforward measurement, all fp32: per layer, one full forward of the calibration
    prompts with that layer quantized, KL against the unquantized forward; most sensitive first."""
    import torch

    from decodebench.quant.apply import fake_quantize
    from decodebench.quant.sensitivity import _rms, _Runner, calibration_tokens

    config = model.config
    tokens = calibration_tokens(config.vocab_size)
    runner = _Runner(model, tokens.shape[1], torch.float32)
    head = model.model.embed_tokens.weight if model.lm_head is None else model.lm_head.weight

    def forward(replace_layer: int | None) -> torch.Tensor:
        hidden = model.model.embed_tokens.weight[tokens].float()[None]
        for index in range(config.num_layers):
            replace = None
            if index == replace_layer:
                replace = {
                    f"model.layers.{index}.{name}": fake_quantize(p, recipe.layer_scheme(
                        "attn" if "self_attn" in name else "ffn", False))
                    for name, p in model.model.layers[index].named_parameters()
                    if name.endswith("_proj.weight")
                }  # fmt: skip
            hidden = runner.layer(hidden, runner.layer_weights(index, replace))
        normed = _rms(hidden[0], model.model.norm.weight, config.rms_norm_eps)
        return torch.log_softmax(normed.reshape(-1, config.hidden_size) @ head.float().T, -1)

    with torch.no_grad():
        reference = forward(None)
        kl = []
        for layer in range(config.num_layers):
            quantized = forward(layer)
            kl.append(float((reference.exp() * (reference - quantized)).sum(-1).mean()))
    return sorted(range(config.num_layers), key=lambda index: -kl[index])


def ours(out: Path, model_name: str, context: int, top: int) -> dict:
    from decodebench.build import build_variant
    from decodebench.buildcache import BuildCache
    from decodebench.contracts.domain import VariantSpec

    variant = VariantSpec(context=context, quant=f"top{top}")
    cache = BuildCache(out / "cache")
    report = build_variant(model_name, variant, out / "build", cache=cache)
    started = time.perf_counter()
    hit = build_variant(model_name, variant, out / "again", cache=cache)
    hit_seconds = time.perf_counter() - started
    assert hit.cache_hit
    return {
        "stage_seconds": report.stage_seconds,
        "promoted": report.quant.promoted_layers if report.quant else [],
        "cache_hit_seconds": round(hit_seconds, 3),
        "package": str(out / "build" / "model.mlpackage"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model", default="exaone-4.0-1.2b", help="preset (tiny-* for a smoke run)"
    )
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--top", type=int, default=8)
    parser.add_argument("--only", choices=["plain", "ours"], help="run one side only")
    parser.add_argument("--child", choices=["plain", "ours"], help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        os.environ.setdefault("TQDM_DISABLE", "1")
        args.out.mkdir(parents=True, exist_ok=True)
        run = plain if args.child == "plain" else ours
        details = run(args.out, args.model, args.context, args.top)
        (args.out / "bench.json").write_text(json.dumps(details))
        return 0

    from decodebench.analysis.analyze import analyze_mlpackage

    results: dict[str, tuple[float, int, dict]] = {}
    with tempfile.TemporaryDirectory(prefix="build-exaone-") as scratch:
        for mode in ("plain", "ours"):
            if args.only and args.only != mode:
                continue
            out = Path(scratch) / mode
            load_before = os.getloadavg()[0]
            wall, peak, details = run_child(mode, out, args.model, args.context, args.top)
            details["load"] = (load_before, os.getloadavg()[0])
            package = out / ("model.mlpackage" if mode == "plain" else "build/model.mlpackage")
            analysis = analyze_mlpackage(package)
            results[mode] = (wall, peak, details)
            constexpr = {k: v for k, v in analysis.op_counts.items() if k.startswith("constexpr")}
            print(f"== {mode}: stages {details['stage_seconds']}")
            print(
                f"   promoted {details['promoted']}; {constexpr}; "
                f"weights {analysis.weight_file_bytes / GIB:.3f} GiB"
            )
    print()
    print("| side  | wall s | peak RSS GiB (GB) | CPU s | load avg before/after |")
    print("| ----- | -----: | ----------------: | ----: | --------------------- |")
    for mode, (wall, peak, details) in results.items():
        before, after = details["load"]
        print(
            f"| {mode:5} | {wall:6.1f} | {peak / GIB:6.2f} ({peak / 10**9:5.2f}) "
            f"| {details['cpu_seconds']:5.1f} | {before:.2f} / {after:.2f} |"
        )
    if "ours" in results:
        print(f"cache hit (same request again): {results['ours'][2]['cache_hit_seconds']:.3f} s")
    if len(results) == 2:
        (plain_wall, plain_peak, _), (our_wall, our_peak, _) = results["plain"], results["ours"]
        print(
            f"ratio plain/ours: wall {plain_wall / our_wall:.2f}x, "
            f"peak RSS {plain_peak / our_peak:.2f}x"
        )
    if "ours" in results:
        our_wall, our_peak, details = results["ours"]
        ok = our_wall < 90 and our_peak < 6 * 10**9 and details["cache_hit_seconds"] < 1
        print(f"goal (ours < 90 s, < 6 GB, cache hit < 1 s): {'met' if ok else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
