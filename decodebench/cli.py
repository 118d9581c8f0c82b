"""`decodebench`: build and analyse variants locally, or submit and follow sweeps on a server."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from decodebench.contracts.api import ComparisonRow, SweepDetail
from decodebench.contracts.build import BuildReport
from decodebench.contracts.domain import Attention, KVCache, VariantSpec
from decodebench.contracts.names import TERMINAL_RUN_STATES, BuildState, SweepState


class CliError(Exception):
    """A user-facing error: printed as one line, exit code 2."""


def _progress_printer(quiet: bool):
    def progress(stage: str, fraction: float) -> None:
        if not quiet:
            print(f"  [{fraction * 100:5.1f}%] {stage}", file=sys.stderr, flush=True)

    return progress


def cmd_build(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

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
    if weights is not None and not (weights / "config.json").is_file():
        raise CliError(f"--weights: {weights} has no config.json")
    try:
        variant = VariantSpec(
            attention=args.attention,
            kv=args.kv,
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
    out_dir = Path(args.out)
    model = args.preset or weights.resolve().name  # type: ignore[union-attr]
    cache = None if args.no_cache else BuildCache(Path(args.cache_dir) if args.cache_dir else None)

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
    key = request_key(model_identity(model, fingerprint), variant, installed_toolchain())
    hit = find_build(out_dir, key, cache)
    if hit is not None:
        print(f"cache hit {key[:12]}: {out_dir / 'model.mlpackage'} ({_summary(hit)})")
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
        f"built {out_dir / 'model.mlpackage'} in {report.wall_seconds:.1f}s "
        f"(key {report.key[:12]}): {_summary(report)}"
    )
    return 0


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


def cmd_analyze(args: argparse.Namespace) -> int:
    from decodebench.analysis.analyze import AnalysisError, analyze_mlpackage, render_analysis

    try:
        analysis = analyze_mlpackage(Path(args.path))
    except AnalysisError as error:
        raise CliError(str(error)) from None
    if args.json:
        payload = analysis.model_dump(mode="json")
        print(json.dumps(payload, indent=2, sort_keys=True))
        return 0
    print(render_analysis(analysis, str(args.path)))
    return 0


def _client(args: argparse.Namespace):
    from decodebench.client import DecodebenchClient

    token = args.token or os.environ.get("DECODEBENCH_TOKEN")
    if not token:
        raise CliError("no API token: pass --token or set DECODEBENCH_TOKEN")
    return DecodebenchClient(args.server, token)


def cmd_submit(args: argparse.Namespace) -> int:
    from decodebench.client import ApiError
    from decodebench.commands import gate

    if args.spec:
        try:
            spec = json.loads(Path(args.spec).read_text())
        except (OSError, json.JSONDecodeError) as error:
            raise CliError(f"cannot read sweep spec {args.spec}: {error}") from None
    else:
        spec = {
            "model": args.model,
            "variants": [{"attention": attention} for attention in args.attention],
            "devices": args.device,
            "prompts": args.prompts,
            "decode_tokens": args.decode_tokens,
        }
    if gate.gating(args):
        return _submit_and_gate(args, spec)
    with _client(args) as client:
        try:
            sweep = client.submit_sweep(spec)
        except ApiError as error:
            raise CliError(f"sweep rejected: {describe_api_error(error)}") from None
        print(f"submitted sweep {sweep.id}: {client.base_url}/sweeps/{sweep.id}")
        if args.wait:
            sweep = wait_for_sweep(client, sweep.id, args.timeout)
            print(_with_answers(sweep))
            return 0 if sweep.state == SweepState.completed else 1
    return 0


def _submit_and_gate(args: argparse.Namespace, spec: dict[str, Any]) -> int:
    """Submit, wait, judge against the baseline, publish: exit 0 pass, 1 regression, 2 error or
    bad input, 3 timed out."""
    from decodebench.client import ApiError
    from decodebench.commands import gate

    try:
        baseline, min_effect = gate.prepare_spec(spec, args)
    except gate.GateInputError as error:
        return gate.publish(gate.decide([], args, error=str(error)), args)
    with _client(args) as client:
        try:
            sweep = client.submit_sweep(spec)
            print(
                f"submitted sweep {sweep.id}: {client.base_url}/sweeps/{sweep.id}", file=sys.stderr
            )
            try:
                sweep = wait_for_sweep(client, sweep.id, args.timeout)
            except CliError:
                return gate.publish(gate.decide([], args, timed_out=True), args)
            if sweep.state != SweepState.completed:
                failed = [run.failure_reason for run in sweep.runs if run.failure_reason]
                message = f"sweep {sweep.id} {sweep.state}: {'; '.join(failed[:3])}"
                return gate.publish(gate.decide([], args, error=message), args)
            verdicts = client.get_verdicts(sweep.id, baseline.sweep_id, min_effect)
        except ApiError as error:
            return gate.publish(gate.decide([], args, error=describe_api_error(error)), args)
    print(format_comparison(sweep), file=sys.stderr)
    if verdicts.note:
        print(f"verdicts: {verdicts.note}", file=sys.stderr)
    return gate.publish(gate.decide(verdicts.verdicts, args), args)


def cmd_status(args: argparse.Namespace) -> int:
    from decodebench.client import ApiError

    with _client(args) as client:
        try:
            sweep = client.get_sweep(args.sweep_id)
        except ApiError as error:
            raise CliError(describe_api_error(error)) from None
    if args.json:
        print(sweep.model_dump_json(indent=2))
    else:
        print(_with_answers(sweep))
    return 0


def _with_answers(sweep: SweepDetail) -> str:
    """The comparison table, then what the model answered (models with a tokenizer)."""
    from decodebench.commands.answers import format_answers

    return "\n\n".join(filter(None, (format_comparison(sweep), format_answers(sweep))))


def describe_api_error(error: Any) -> str:
    detail = error.detail
    if isinstance(detail, list):  # FastAPI validation errors: name each field
        parts = []
        for item in detail:
            location = ".".join(str(part) for part in item.get("loc", []) if part != "body")
            parts.append(f"{location}: {item.get('msg')}")
        return "; ".join(parts)
    return f"HTTP {error.status_code}: {detail}"


def wait_for_sweep(client: Any, sweep_id: int, timeout_s: float) -> SweepDetail:
    deadline = time.monotonic() + timeout_s
    last_line = ""
    while True:
        sweep = client.get_sweep(sweep_id)
        line = progress_line(sweep)
        if line != last_line:
            print(line, file=sys.stderr, flush=True)
            last_line = line
        if sweep.state in (SweepState.completed, SweepState.failed):
            return sweep
        if time.monotonic() > deadline:
            raise CliError(f"sweep {sweep_id} still {sweep.state} after {timeout_s:.0f}s")
        time.sleep(1.0)


def progress_line(sweep: SweepDetail) -> str:
    builds = ", ".join(
        f"{build.label}: {build.state}"
        + (
            f" {build.stage} {build.progress * 100:.0f}%"
            if build.state == BuildState.building
            else ""
        )
        for build in sweep.builds
    )
    done = sum(run.state in TERMINAL_RUN_STATES for run in sweep.runs)
    return f"sweep {sweep.id} {sweep.state}: builds [{builds}]; runs {done}/{len(sweep.runs)} done"


def _versus_baseline(row: ComparisonRow, baseline: str) -> str:
    """``1.63x [1.60, 1.66] faster`` (the verdict with its interval), ``baseline`` or ``—``."""
    if row.variant == baseline:
        return "baseline"
    if row.verdict is None:
        return "—"
    decode = row.verdict.decode_tok_s
    changed = "" if row.verdict.agreement is None or row.verdict.agreement.identical else " ≠tokens"
    return f"{decode.interval_text()} {decode.label}{changed}"


def format_comparison(sweep: SweepDetail) -> str:
    header = (
        f"{'device':16s} {'variant':28s} {'decode tok/s':>18s} {'vs baseline (95% CI)':>34s} "
        f"{'predicted':>10s} {'tiles':>6s} {'tile MiB':>9s}  source"
    )
    lines = [
        f"sweep {sweep.id} · {sweep.model} · {sweep.state}",
        header,
        "-" * len(header),
    ]
    for row in sweep.results:
        mean = row.decode_tok_s_mean
        rate = f"{mean:.1f} ± {row.decode_tok_s_ci95 or 0:.1f}" if mean is not None else "—"
        speedup = _versus_baseline(row, sweep.baseline)
        predicted = f"{row.predicted_tok_s:.1f}" if row.predicted_tok_s else "—"
        tiles = "—" if row.tile_ops is None else str(row.tile_ops)
        tile_mib = "—" if row.tile_mib is None else f"{row.tile_mib:.1f}"
        source = {True: "SIMULATED", False: "measured", None: "—"}[row.simulated]
        lines.append(
            f"{row.device_class:16s} {row.variant:28s} {rate:>18s} {speedup:>34s} "
            f"{predicted:>10s} {tiles:>6s} {tile_mib:>9s}  {source}"
        )
    if sweep.simulated:
        lines.append(
            "SIMULATED rows: timings from the device profile's roofline model, not an iPhone."
        )
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="decodebench", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    build = commands.add_parser("build", help="convert one variant to an .mlpackage and analyse it")
    source = build.add_mutually_exclusive_group()
    source.add_argument("--preset", default=None, help="model preset (random weights)")
    source.add_argument(
        "--weights", default=None, help="Hugging Face folder: config.json + *.safetensors"
    )
    build.add_argument("--attention", choices=[a.value for a in Attention], default="folded")
    build.add_argument("--kv", choices=[k.value for k in KVCache], default="state")
    build.add_argument("--context", type=int, default=512)
    build.add_argument("--prefill-chunk", type=int, default=None, help="add a prefill function")
    build.add_argument("--layers", type=int, default=None)
    build.add_argument(
        "--quant",
        default="fp16",
        help="recipe: fp16, w8, w4, base, topK, or rules like ffn=int4/32",
    )
    build.add_argument("--out", required=True, help="output folder (model.mlpackage, build.json)")
    build.add_argument("--no-cache", action="store_true", help="neither reuse nor store builds")
    build.add_argument(
        "--cache-dir", default=None, help="build cache (default ~/.cache/decodebench)"
    )
    build.add_argument("--quiet", action="store_true")
    build.set_defaults(handler=cmd_build)

    analyze = commands.add_parser("analyze", help="analyse the graph of a saved .mlpackage")
    analyze.add_argument("path")
    analyze.add_argument("--json", action="store_true", help="print one JSON object")
    analyze.set_defaults(handler=cmd_analyze)
    from decodebench.commands import diff, fold, model, schedule, verify

    for command in (diff, fold, model, schedule, verify):
        command.register(commands)

    for name, handler, help_text in (
        ("submit", cmd_submit, "submit a sweep to a server"),
        ("status", cmd_status, "show a sweep's comparison table"),
    ):
        sub = commands.add_parser(name, help=help_text)
        sub.add_argument(
            "--server", default=os.environ.get("DECODEBENCH_SERVER_URL", "http://127.0.0.1:8000")
        )
        sub.add_argument("--token", default=None, help="user API token (or DECODEBENCH_TOKEN)")
        sub.set_defaults(handler=handler)
        if name == "submit":
            sub.add_argument("--spec", help="a sweep spec JSON file (overrides the flags below)")
            sub.add_argument("--model", default="tiny-gqa")
            sub.add_argument("--attention", action="append", default=None)
            sub.add_argument("--device", action="append", default=None)
            sub.add_argument("--prompts", type=int, default=30)
            sub.add_argument("--decode-tokens", type=int, default=32)
            sub.add_argument("--wait", action="store_true", help="follow progress, print the table")
            sub.add_argument("--timeout", type=float, default=3600)
            from decodebench.commands.gate import add_gate_options

            add_gate_options(sub)
        else:
            sub.add_argument("sweep_id", type=int)
            sub.add_argument("--json", action="store_true")
    return parser


def quiet_toolchain() -> None:
    """The CLI prints its own stages: drop coremltools' import chatter about the macOS-only
    runtime and the pinned torch version, and its per-pass progress bars."""
    logging.getLogger("coremltools").setLevel(logging.ERROR)
    os.environ.setdefault("TQDM_DISABLE", "1")


def main(argv: list[str] | None = None) -> int:
    quiet_toolchain()
    args = build_parser().parse_args(argv)
    if args.command == "submit" and not getattr(args, "spec", None):
        args.attention = args.attention or ["repeat_kv", "folded"]
        args.device = args.device or ["iphone-16-pro", "iphone-17-pro"]
    try:
        return args.handler(args)
    except CliError as error:
        print(f"decodebench: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
