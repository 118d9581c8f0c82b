"""Full EXAONE 4.0 1.2B top8 build (ctx 4096, stateful KV): plain coremltools against ours.

Both run in the same invocation, each in its own process (wall time and peak RSS of that
process alone, from wait4), on the same seeded weights:

- plain: per-layer sensitivity done the straightforward way (one full forward per layer), then
  ``torch.jit.trace``, ``ct.convert`` with the default pipeline, ``ct.optimize.coreml``
  palettization of the lm_head (6-bit, uniform: kmeans needs kmeans1d or scikit-learn) and
  linear quantization (int4/32, the 8 promoted layers int8 per channel), ``save``;
- ours: ``decodebench.build.build_variant`` (no cache), then the same request again (cache hit).

    flock /tmp/decodebench-bench.lock python bench/build_exaone.py [--context 4096] [--top 8]
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

GIB = 1024**3


def run_child(mode: str, out: Path, context: int, top: int) -> tuple[float, int, dict]:
    command = [sys.executable, __file__, "--child", mode, "--out", str(out)]
    command += ["--context", str(context), "--top", str(top)]
    started = time.perf_counter()
    process = subprocess.Popen(command)
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - started
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{mode} build failed ({status})")
    details = json.loads((out / "bench.json").read_text())
    return wall, usage.ru_maxrss * 1024, details


def plain(out: Path, context: int, top: int) -> dict:
    import coremltools as ct
    import numpy as np
    import torch
    from coremltools.optimize import coreml as cto

    from decodebench import coreml_compat
    from decodebench.convert import _input_types, _state_types
    from decodebench.modeling import build_model, step_inputs
    from decodebench.presets import EXAONE_4_0_1_2B
    from decodebench.quant.apply import QuantPlan, fake_quantize
    from decodebench.quant.recipe import parse_recipe
    from decodebench.quant.sensitivity import _Runner, calibration_tokens

    seconds: dict[str, float] = {}
    clock = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal clock
        seconds[name] = round(time.perf_counter() - clock, 1)
        clock = time.perf_counter()
        print(f"  [plain] {name} {seconds[name]}s", flush=True)

    config = EXAONE_4_0_1_2B
    model = build_model(config, context, "folded", torch.float16)
    lap("build_model")
    recipe = parse_recipe(f"top{top}")
    plan = QuantPlan(recipe, config.tie_word_embeddings)
    tokens = calibration_tokens(config.vocab_size)
    runner = _Runner(model, tokens.shape[1])
    with torch.no_grad():

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
            return runner.log_probabilities(hidden)[0]

        reference = forward(None)
        kl = []
        for layer in range(config.num_layers):
            quantized = forward(layer)
            kl.append(float((reference.exp() * (reference - quantized)).sum(-1).mean()))
    promoted = sorted(sorted(range(config.num_layers), key=lambda i: -kl[i])[:top])
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
    return {"stage_seconds": seconds, "promoted": promoted}


def ours(out: Path, context: int, top: int) -> dict:
    from decodebench.build import build_variant
    from decodebench.buildcache import BuildCache
    from decodebench.domain import VariantSpec
    from decodebench.presets import EXAONE_4_0_1_2B

    variant = VariantSpec(context=context, quant=f"top{top}")
    cache = BuildCache(out / "cache")
    report = build_variant(EXAONE_4_0_1_2B.name, variant, out / "build", cache=cache)
    started = time.perf_counter()
    hit = build_variant(EXAONE_4_0_1_2B.name, variant, out / "again", cache=cache)
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
        details = run(args.out, args.context, args.top)
        (args.out / "bench.json").write_text(json.dumps(details))
        return 0

    from decodebench.analysis import analyze_mlpackage

    results = {}
    with tempfile.TemporaryDirectory(prefix="build-exaone-") as scratch:
        for mode in ("plain", "ours"):
            if args.only and args.only != mode:
                continue
            out = Path(scratch) / mode
            wall, peak, details = run_child(mode, out, args.context, args.top)
            package = out / ("model.mlpackage" if mode == "plain" else "build/model.mlpackage")
            analysis = analyze_mlpackage(package)
            results[mode] = (wall, peak)
            constexpr = {k: v for k, v in analysis.op_counts.items() if k.startswith("constexpr")}
            print(f"== {mode}: wall {wall:.1f} s, peak RSS {peak / GIB:.2f} GiB")
            print(f"   stages {details['stage_seconds']}")
            print(
                f"   promoted {details['promoted']}; {constexpr}; weights {analysis.weight_file_bytes / GIB:.3f} GiB"
            )
            if "cache_hit_seconds" in details:
                print(f"   cache hit {details['cache_hit_seconds']:.3f} s")
    if len(results) == 2:
        (plain_wall, plain_peak), (our_wall, our_peak) = results["plain"], results["ours"]
        print(
            f"== ratio plain/ours: wall {plain_wall / our_wall:.2f}x, "
            f"peak RSS {plain_peak / our_peak:.2f}x"
        )
        ok = our_wall < 90 and our_peak < 6 * 10**9
        print(f"== goal (< 90 s, < 6 GB): {'met' if ok else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
