"""``decodebench build --preset NAME|--weights DIR --out DIR``: one variant, converted and analysed.

Converts a model preset (random weights) or a Hugging Face checkpoint to ``OUT/model.mlpackage``
with the chosen attention layout, KV cache, context and quantization recipe, then writes the
graph analysis to ``OUT/build.json``. The build cache is asked first: a hit takes milliseconds.
Exit status 0, or 2 on bad input or a failed build.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from decodebench.commands.common import CliError
from decodebench.contracts.build import BuildReport
from decodebench.contracts.domain import Attention, KVCache, VariantSpec


def register(subparsers: Any) -> None:
    build = subparsers.add_parser(
        "build",
        help="convert one variant to an .mlpackage and analyse it",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    source = build.add_mutually_exclusive_group()
    source.add_argument("--preset", default=None, help="model preset (random weights)")
    source.add_argument(
        "--weights",
        default=None,
        help="Hugging Face folder (config.json + *.safetensors) or a .gguf file (Llama, Qwen2, "
        "Qwen3, Phi-3, Gemma 3; dequantized once into the cache)",
    )
    build.add_argument("--attention", choices=[a.value for a in Attention], default="folded")
    build.add_argument(
        "--format",
        choices=["coreml", "coreai"],
        default="coreml",
        help="model format: coreml (model.mlpackage) or coreai (model.aimodel, Core AI)",
    )
    build.add_argument(
        "--kv",
        choices=[k.value for k in KVCache],
        default=None,
        help="KV cache as states or as inputs (default: state; input for coreai)",
    )
    build.add_argument(
        "--kv-window",
        action="store_true",
        help="sliding-window layers cache only their window (a ring; kv=state, no prefill)",
    )
    build.add_argument("--context", type=int, default=512)
    build.add_argument("--prefill-chunk", type=int, default=None, help="add a prefill function")
    build.add_argument("--layers", type=int, default=None)
    build.add_argument(
        "--quant",
        default="fp16",
        help="recipe: fp16, w8, w4, base, topK, or rules like ffn=int4/32",
    )
    build.add_argument(
        "--out", required=True, help="output folder (model.mlpackage or model.aimodel, build.json)"
    )
    build.add_argument("--no-cache", action="store_true", help="neither reuse nor store builds")
    build.add_argument(
        "--cache-dir", default=None, help="build cache (default ~/.cache/decodebench)"
    )
    build.add_argument("--quiet", action="store_true")
    build.set_defaults(handler=cmd_build)


def _progress_printer(quiet: bool) -> Callable[[str, float], None]:
    def progress(stage: str, fraction: float) -> None:
        if not quiet:
            print(f"  [{fraction * 100:5.1f}%] {stage}", file=sys.stderr, flush=True)

    return progress


def _variant(args: argparse.Namespace) -> VariantSpec:
    from pydantic import ValidationError

    try:
        return VariantSpec(
            format=args.format,
            attention=args.attention,
            kv=KVCache(args.kv or ("input" if args.format == "coreai" else "state")),
            kv_window=args.kv_window,
            context=args.context,
            prefill_chunk=args.prefill_chunk,
            layers=args.layers,
            quant=args.quant,
        )
    except ValidationError as error:
        first = error.errors()[0]
        field = str(first["loc"][0]) if first["loc"] else "variant"
        message = str(first["msg"]).removeprefix("Value error, ")
        raise CliError(f"--{field.replace('_', '-')}: {message}") from None


def cmd_build(args: argparse.Namespace) -> int:
    from decodebench.building.cache import (
        BuildCache,
        find_build,
        model_identity,
        request_key,
    )
    from decodebench.contracts.presets import MODELS
    from decodebench.toolchain import installed_toolchain

    weights = Path(args.weights) if args.weights else None
    if weights is None and args.preset is None:
        raise CliError("give --preset NAME or --weights DIR")
    if weights is None and args.preset not in MODELS:
        raise CliError(f"unknown preset {args.preset!r}; known: {', '.join(sorted(MODELS))}")
    variant = _variant(args)
    out_dir = Path(args.out)
    model = args.preset or weights.resolve().name  # type: ignore[union-attr]
    cache = None if args.no_cache else BuildCache(Path(args.cache_dir) if args.cache_dir else None)
    if weights is not None and weights.suffix == ".gguf" and weights.is_file():
        model = weights.name.split(".")[0]
        weights = _dequantized(weights, cache.root if cache else out_dir)
    if weights is not None and not (weights / "config.json").is_file():
        raise CliError(f"--weights: {weights} has no config.json")

    # The cache is asked before torch and coremltools are imported: a hit takes milliseconds.
    fingerprint = None
    if weights is not None:
        from decodebench.building.weights import WeightsError
        from decodebench.building.weights import fingerprint as weights_fingerprint

        memo = (cache.root if cache else out_dir) / "fingerprints.json"
        try:
            fingerprint = weights_fingerprint(weights, memo)
        except WeightsError as error:
            raise CliError(f"--weights: {error}") from None
    key = request_key(
        model_identity(model, fingerprint), variant, installed_toolchain(variant.format)
    )
    hit = find_build(out_dir, key, cache)
    if hit is not None:
        print(f"cache hit {key[:12]}: {out_dir / hit.package} ({_summary(hit)})")
        _print_checks(hit)
        return 0

    from decodebench.building.build import BuildError, build_variant
    from decodebench.building.weights import WeightsError

    try:
        report = build_variant(
            model, variant, out_dir, progress=_progress_printer(args.quiet),
            weights=weights, cache=cache,
        )  # fmt: skip
    except (BuildError, WeightsError) as error:
        raise CliError(str(error)) from None
    print(
        f"built {out_dir / report.package} in {report.wall_seconds:.1f}s "
        f"(key {report.key[:12]}): {_summary(report)}"
    )
    _print_checks(report)
    return 0


def _print_checks(report: BuildReport) -> None:
    """The build's check against its format's own runtime, and its known-fault warnings."""
    if report.reference_check:
        print(f"  {report.reference_check}")
    for warning in report.warnings:
        print(f"  warning: {warning}")


def _dequantized(gguf: Path, root: Path) -> Path:
    """The GGUF file as a Hugging Face folder, dequantized by transformers once (cached)."""
    from decodebench.building.realmodels import FetchError, dequantize_gguf
    from decodebench.modelfiles import ModelFileError

    try:
        return dequantize_gguf(gguf, root)
    except (ModelFileError, FetchError) as error:
        raise CliError(f"--weights: {error}") from None


def _summary(report: BuildReport) -> str:
    analysis = report.analysis
    parts = [
        f"{analysis.ops_total} ops",
        f"{analysis.tile_ops} tile ops ({analysis.tile_output_bytes / 2**20:.1f} MiB)",
        f"{analysis.bytes_per_token.total:,} bytes moved per token",
    ]
    quant = report.quant
    if quant:
        compressed = ", ".join(f"{count} {op}" for op, count in sorted(quant.constexpr_ops.items()))
        parts.append(f"quant {quant.recipe}: {compressed}")
        if quant.promoted_layers:
            parts.append(f"int8 layers {quant.promoted_layers}")
    return "; ".join(parts)
