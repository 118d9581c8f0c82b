"""``decodebench status SWEEP_ID``: a sweep's comparison table, and what the model answered.

One row per device class x variant: the variant's model format (Core ML, Core AI), decode tok/s
with its 95% interval, the verdict against the baseline variant, the predicted tok/s, the tile
ops, the mean cold and warm load (a Core AI cold load is the asset's specialization), and
whether the timings were measured on an iPhone or simulated. Sweeps of models with a tokenizer add each variant's answers beside the fp32
reference. Exit status 0, or 2 on a server error.
"""

from __future__ import annotations

import argparse
from typing import Any

from decodebench.commands.common import CliError, add_server_options, client, describe_api_error
from decodebench.contracts.api import ComparisonRow, SweepDetail


def register(subparsers: Any) -> None:
    status = subparsers.add_parser(
        "status",
        help="show a sweep's comparison table",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_server_options(status)
    status.add_argument("sweep_id", type=int)
    status.add_argument("--json", action="store_true")
    status.set_defaults(handler=cmd_status)


def cmd_status(args: argparse.Namespace) -> int:
    from decodebench.client import ApiError

    with client(args) as server:
        try:
            sweep = server.get_sweep(args.sweep_id)
        except ApiError as error:
            raise CliError(describe_api_error(error)) from None
    if args.json:
        print(sweep.model_dump_json(indent=2))
    else:
        print(with_answers(sweep))
    return 0


def with_answers(sweep: SweepDetail) -> str:
    """The comparison table, then what the model answered (models with a tokenizer)."""
    from decodebench.commands.answers import format_answers

    return "\n\n".join(filter(None, (format_comparison(sweep), format_answers(sweep))))


def _versus_baseline(row: ComparisonRow, baseline: str) -> str:
    """``1.63x [1.60, 1.66] faster`` (the verdict with its interval), ``baseline`` or ``—``."""
    if row.variant == baseline:
        return "baseline"
    if row.verdict is None:
        return "—"
    decode = row.verdict.decode_tok_s
    if row.decode_tok_s_ci95 is None:  # one sample: a ratio, no interval and no verdict
        return f"{decode.ratio:.3f}x (n = {row.prompts_measured}, no verdict)"
    changed = "" if row.verdict.agreement is None or row.verdict.agreement.identical else " ≠tokens"
    return f"{decode.interval_text()} {decode.label}{changed}"


FORMAT_TITLES = {"coreml": "Core ML", "coreai": "Core AI"}


def _loads(row: ComparisonRow) -> str:
    """``412 / 35`` (cold / warm ms); a Core AI cold load is labelled its specialization."""
    if row.load_time_cold_ms is None or row.load_time_warm_ms is None:
        return "—"
    cold = f"{row.load_time_cold_ms:.0f}"
    if row.format == "coreai":
        cold += " (specialization)"
    return f"{cold} / {row.load_time_warm_ms:.0f}"


def _rate(row: ComparisonRow) -> str:
    """The mean ± its 95% half-width, or ``n = 1`` where one sample gives no interval."""
    if row.decode_tok_s_mean is None:
        return "—"
    if row.decode_tok_s_ci95 is None:
        return f"{row.decode_tok_s_mean:.1f} (n = {row.prompts_measured})"
    return f"{row.decode_tok_s_mean:.1f} ± {row.decode_tok_s_ci95:.1f}"


def format_comparison(sweep: SweepDetail) -> str:
    header = (
        f"{'device':16s} {'variant':28s} {'format':7s} {'decode tok/s':>18s} "
        f"{'vs baseline (95% CI)':>34s} {'predicted':>10s} {'tiles':>6s} {'tile MiB':>9s} "
        f"{'load ms cold / warm':>28s}  source"
    )
    lines = [
        f"sweep {sweep.id} · {sweep.model} · {sweep.state}",
        header,
        "-" * len(header),
    ]
    for row in sweep.results:
        rate = _rate(row)
        speedup = _versus_baseline(row, sweep.baseline)
        predicted = f"{row.predicted_tok_s:.1f}" if row.predicted_tok_s else "—"
        tiles = "—" if row.tile_ops is None else str(row.tile_ops)
        tile_mib = "—" if row.tile_mib is None else f"{row.tile_mib:.1f}"
        source = {True: "SIMULATED", False: "measured", None: "—"}[row.simulated]
        kind = FORMAT_TITLES.get(row.format, row.format)
        lines.append(
            f"{row.device_class:16s} {row.variant:28s} {kind:7s} {rate:>18s} {speedup:>34s} "
            f"{predicted:>10s} {tiles:>6s} {tile_mib:>9s} {_loads(row):>28s}  {source}"
        )
    if sweep.simulated:
        lines.append(
            "SIMULATED rows: timings from the device profile's roofline model, not an iPhone."
        )
    return "\n".join(lines)
