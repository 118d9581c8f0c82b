"""``decodebench doctor PKG``: diagnose, repair and prove a Core ML LLM in one pass.

Decodes the chat prompts (each prompt, then ``--steps`` greedy tokens) once with the package's
own fp32 run, recording every op's largest |value|, with every repair candidate teacher-forced
beside it. Prints the fp16 hazards (the first overflow named by layer and role, the layers that
overflow), the avoidable bytes per token with their fixes and predicted tok/s, the repairs
applied or refused, the agreement with the fp32 run (prompts identical, first divergent step,
logit error, the reference's margin where a prompt diverges), and the graph analysis before and
after (bytes per token, predicted tok/s per device class). The repaired package is written to
``--out`` (default ``<PKG stem>.repaired.mlpackage`` beside PKG; an existing path is refused
unless ``--force``).

Prompts: the tokenizer of ``--weights DIR`` (a Hugging Face folder) or of ``--model`` (default
smollm2-135m, fetched once); a checkpoint folder without a tokenizer gets the prompts as
pseudo-tokens of its vocabulary. When ``--weights DIR`` holds a checkpoint (config.json and
*.safetensors), transformers fp32 decodes the same prompts and the package's fp32 run and the
repaired package are compared with it.

Progress goes to stderr, one line per prompt. Exit status 0 when the repaired package was
written, 2 on bad input (one line saying what is wrong; nothing written).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

OVERFLOWS_SHOWN = 12  # in the text; --json lists every one


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "doctor",
        help="diagnose, repair and prove a Core ML LLM in one pass",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("package", metavar="PKG", help="the .mlpackage to cure")
    parser.add_argument(
        "--out", metavar="OUT.mlpackage", help="the repaired package (default: beside PKG)"
    )
    parser.add_argument("--force", action="store_true", help="replace an existing --out")
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--weights", metavar="DIR", help="Hugging Face folder: its tokenizer, its checkpoint"
    )
    source.add_argument("--model", help="registry model whose tokenizer to use (smollm2-135m)")
    parser.add_argument("--prompts", type=int, default=30, help="chat prompts (default 30)")
    parser.add_argument("--steps", type=int, default=16, help="greedy tokens (default 16)")
    parser.add_argument("--json", action="store_true", help="print the DoctorReport as JSON")
    parser.set_defaults(handler=cmd_doctor)


def default_out(package: Path) -> Path:
    return package.with_name(f"{package.stem}.repaired.mlpackage")


def _prompts(args: argparse.Namespace) -> tuple[list[list[int]], str, Path | None]:
    """The prompts' token ids, where they come from, and the checkpoint folder (if any)."""
    from decodebench.doctor.checkpoint import has_checkpoint
    from decodebench.prompts import CHAT_PROMPT_COUNT, chat_prompts, chat_token_ids, has_tokenizer

    if not 1 <= args.prompts <= CHAT_PROMPT_COUNT:
        raise ValueError(f"--prompts must be between 1 and {CHAT_PROMPT_COUNT}, got {args.prompts}")
    if args.steps < 1:
        raise ValueError(f"--steps must be at least 1, got {args.steps}")
    texts = [prompt.text for prompt in chat_prompts(args.prompts)]
    if args.weights:
        weights = Path(args.weights)
        if not weights.is_dir():
            raise ValueError(f"--weights {weights} is not a folder")
        checkpoint = weights if has_checkpoint(weights) else None
        if has_tokenizer(weights):
            return (
                chat_token_ids(weights, texts),
                f"chat prompts, tokenizer of {weights}",
                checkpoint,
            )
        if checkpoint is None:
            raise ValueError(f"--weights {weights} holds neither a tokenizer nor a checkpoint")
        vocab = _config_vocab(weights)
        ids = [prompt.token_ids(vocab) for prompt in chat_prompts(args.prompts)]
        return ids, f"chat prompts as pseudo-tokens of {weights}'s {vocab} ids", checkpoint
    from decodebench.building.realmodels import fetch_model

    name = args.model or "smollm2-135m"
    folder = fetch_model(name)
    if not has_tokenizer(folder):
        raise ValueError(f"model {name} has no tokenizer to encode the chat prompts with")
    return chat_token_ids(folder, texts), f"chat prompts, tokenizer of {name}", None


def _config_vocab(folder: Path) -> int:
    try:
        config = json.loads((folder / "config.json").read_text())
        vocab = config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")
    except (OSError, ValueError, AttributeError) as error:
        raise ValueError(f"{folder}/config.json cannot be read ({error})") from None
    if not isinstance(vocab, int) or vocab < 2:
        raise ValueError(f"{folder}/config.json has no vocab_size")
    return vocab


def _check_paths(args: argparse.Namespace) -> tuple[Path, Path]:
    from decodebench.formats.coreml.program import MilError

    package = Path(args.package)
    if not (package / "Manifest.json").is_file():
        raise MilError(f"{package} is not an .mlpackage (no Manifest.json)")
    out = Path(args.out) if args.out else default_out(package)
    if out.resolve() == package.resolve():
        raise MilError("--out must differ from PKG")
    if out.suffix != ".mlpackage":
        raise MilError(f"--out {out} must end in .mlpackage")
    if out.exists() and not args.force:
        raise MilError(f"{out} exists (pass --force to replace it)")
    return package, out


def cmd_doctor(args: argparse.Namespace) -> int:
    from decodebench.doctor.doctor import doctor
    from decodebench.formats.coreml.program import MilError, quiet_coremltools

    source = ""
    said: list[str] = []

    def progress(message: str) -> None:
        if not said:  # the inputs are valid once the doctor speaks
            said.append(source)
            print(
                f"doctor: {args.prompts} {source}; {args.steps} greedy steps each", file=sys.stderr
            )
        print(f"doctor: {message}", file=sys.stderr, flush=True)

    try:
        package, out = _check_paths(args)
        with quiet_coremltools():
            prompts, source, checkpoint = _prompts(args)
            report = doctor(package, out, prompts, args.steps, progress, weights=checkpoint)
    except (MilError, ValueError, OSError) as error:
        print(f"decodebench doctor: error: {error}", file=sys.stderr)
        return 2
    if args.json:
        print(report.model_dump_json(indent=2))
    else:
        print(render(report, source))
    return 0


def render(report: Any, prompts: str = "") -> str:
    """The doctor's report as text: hazards, waste, repairs, agreement, analysis."""
    from decodebench.doctor.headroom import render as render_headroom
    from decodebench.doctor.repair_text import render as render_repair
    from decodebench.doctor.waste import render as render_waste

    lines = [
        f"doctor {report.package}: {report.prompts} prompts x {report.steps} greedy steps"
        + (f" ({prompts})" if prompts else "")
        + f", {report.seconds:.0f} s",
        "",
        *render_headroom(report.headroom, overflows_shown=OVERFLOWS_SHOWN),
        "",
        *render_waste(report.waste, report.analysis),
        "",
        render_repair(report.repair),
    ]
    if report.checkpoint is not None:
        lines += ["", *render_checkpoint(report.checkpoint)]
    lines += ["", *render_analyses(report.analysis, report.repaired_analysis)]
    return "\n".join(lines)


def render_checkpoint(checkpoint: Any) -> list[str]:
    lines = [f"against transformers fp32 of {checkpoint.weights} (its own greedy tokens)"]
    for label, agreement in (
        ("package fp32", checkpoint.reference),
        (f"repaired ({agreement_name(checkpoint.repaired)})", checkpoint.repaired),
    ):
        lines.append(f"  {label:24} {agreement.summary()}")
        lines += [f"    {line}" for line in agreement.divergences()]
    return lines


def agreement_name(agreement: Any) -> str:
    return "nothing applied" if agreement.candidate == "original" else agreement.candidate


def render_analyses(before: Any, after: Any | None) -> list[str]:
    """Bytes per token and predicted tok/s per device class, before and after the repair."""
    mib = 2**20
    lines = ["analysis (predictions from bytes per token, not measurements)"]
    if after is None:
        lines.append(f"  bytes per token {before.bytes_per_token.total / mib:,.1f} MiB")
        return lines
    lines.append(
        f"  bytes per token      {before.bytes_per_token.total / mib:,.1f} MiB -> "
        f"{after.bytes_per_token.total / mib:,.1f} MiB"
    )
    lines.append(f"  dispatched ops       {before.dispatch_ops:,} -> {after.dispatch_ops:,}")
    now, then = before.predicted_tok_s(), after.predicted_tok_s()
    for device, rate in now.items():
        lines.append(f"  predicted {device:20} {rate:,.1f} -> {then.get(device, 0.0):,.1f} tok/s")
    return lines
