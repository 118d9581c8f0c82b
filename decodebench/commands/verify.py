"""``decodebench verify A B --steps N``: do two programs decode the same? (Core ML or Core AI)
``decodebench verify A [B] --weights DIR``: do they decode transformers fp32's tokens?

Each program's KV cache is its Core ML states or, the older layout, inputs it returns whole,
updated, as outputs of the same shape (fed back at the next step); the two may differ.

Exit status: 0 when the greedy tokens agree (and logits stay within ``--atol``), 1 when they
diverge or either program yields a non-finite value (the op is named), 2 when the programs
cannot be loaded, recognised or run.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Literal

AGREE, DIVERGE, ERROR = 0, 1, 2


def register(subparsers: Any) -> None:
    from decodebench.formats.coreml.defaults import DEFAULT_ATOL, DEFAULT_PROMPT, DEFAULT_RTOL

    parser = subparsers.add_parser(
        "verify",
        help="run two programs (.mlpackage or .aimodel) in the project's engines and compare "
        "their decoding",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "a",
        metavar="A",
        help="first program, .mlpackage or .aimodel (its greedy tokens drive both)",
    )
    parser.add_argument(
        "b", metavar="B", nargs="?", default=None,
        help="second program (.mlpackage or .aimodel); optional with --weights",
    )  # fmt: skip
    parser.add_argument(
        "--weights", metavar="DIR", default=None,
        help="the checkpoint's Hugging Face folder: hold each program to transformers fp32's "
        "greedy tokens on the chat prompts",
    )  # fmt: skip
    parser.add_argument(
        "--prompts", type=int, default=None,
        help="with --weights: how many chat prompts (1-30, default 30)",
    )  # fmt: skip
    parser.add_argument("--steps", type=int, default=8, help="tokens to generate (default 8)")
    parser.add_argument(
        "--prompt",
        default=",".join(str(token) for token in DEFAULT_PROMPT),
        help="comma-separated prompt token ids (default %(default)s)",
    )
    parser.add_argument(
        "--inputs", metavar="FILE", help="JSON file naming token/position/mask/logits"
    )
    parser.add_argument(
        "--atol",
        type=float,
        default=DEFAULT_ATOL,
        help="absolute logit difference still counted as agreement (default %(default)s)",
    )
    parser.add_argument(
        "--rtol",
        type=float,
        default=DEFAULT_RTOL,
        help="plus this fraction of the step's largest |logit| (default %(default)s)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(handler=cmd_verify)


def _prompt(text: str) -> list[int]:
    try:
        tokens = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"--prompt must be comma-separated integers, got {text!r}") from None
    if not tokens or min(tokens) < 0:
        raise ValueError("--prompt needs at least one non-negative token id")
    return tokens


def cmd_verify(args: argparse.Namespace) -> int:
    from decodebench.formats.coreml.inputs import load_mapping
    from decodebench.formats.coreml.program import MilError, quiet_coremltools
    from decodebench.formats.coreml.verify import verify_packages

    if args.weights is not None:
        return _against_the_checkpoint(args)
    if args.b is None:
        print("decodebench verify: error: give B, or --weights DIR", file=sys.stderr)
        return ERROR
    try:
        mapping = load_mapping(args.inputs) if args.inputs else None
        with quiet_coremltools():
            if any(Path(path).suffix == ".aimodel" for path in (args.a, args.b)):
                result = _verify_any_format(args, mapping)
            else:
                result = verify_packages(
                    args.a, args.b, args.steps, _prompt(args.prompt), mapping, args.atol,
                    args.rtol,
                )  # fmt: skip
    except (MilError, ValueError) as error:
        print(f"decodebench verify: error: {error}", file=sys.stderr)
        if args.json:
            print(json.dumps({"error": str(error)}))
        return ERROR
    if args.json:
        print(json.dumps(result.model_dump(mode="json"), indent=2))
    else:
        print(render(result))
    return AGREE if result.agree else DIVERGE


def _against_the_checkpoint(args: argparse.Namespace) -> int:
    """Each program's greedy tokens on the chat prompts against transformers fp32's."""
    import json as json_module

    from decodebench.building.agreement import measure_agreement
    from decodebench.building.reference import reference_outputs
    from decodebench.formats.coreml.program import MilError, quiet_coremltools
    from decodebench.prompts import CHAT_PROMPT_COUNT, chat_prompts, has_tokenizer, prompt_token_ids

    weights = Path(args.weights)
    try:
        if not (weights / "config.json").is_file() or not has_tokenizer(weights):
            raise ValueError(f"--weights: {weights} has no config.json and tokenizer")
        vocab = int(json_module.loads((weights / "config.json").read_text())["vocab_size"])
        prompts = prompt_token_ids(chat_prompts(args.prompts or CHAT_PROMPT_COUNT), vocab, weights)
        references = reference_outputs(weights, prompts, args.steps)
        with quiet_coremltools():
            reports = [
                measure_agreement(path, prompts, references, args.steps)
                for path in (args.a, args.b)
                if path is not None
            ]
    except (MilError, ValueError, OSError, KeyError) as error:
        print(f"decodebench verify: error: {error}", file=sys.stderr)
        return ERROR
    if args.json:
        print(json.dumps([report.model_dump(mode="json") for report in reports], indent=2))
    for report in reports:
        if args.json:
            break
        divergent = {r.index: r.matching_prefix for r in report.prompts if not r.agree}
        print(
            f"{report.package}: {report.agreeing}/{len(report.prompts)} prompts identical to "
            f"transformers fp32 over {report.steps} tokens (token agreement "
            f"{report.token_agreement:.3f}; non-finite {report.non_finite}; first divergence by "
            f"prompt {divergent})"
        )
    return AGREE if all(r.agreeing == len(r.prompts) for r in reports) else DIVERGE


def _verify_any_format(args: argparse.Namespace, mapping: Any) -> Any:
    """Two packages of which one at least is a Core AI asset: each decoded on its format's
    engine (a Core AI asset on the project's engine), compared step by step as any two."""
    from decodebench.formats import get_format
    from decodebench.formats.coreml.inputs import DecodeInterface, MappingFile
    from decodebench.formats.coreml.verify import compare_sessions, open_session

    sessions = []
    programs: list[tuple[Literal["a", "b"], str]] = [("a", args.a), ("b", args.b)]
    for label, path in programs:
        if Path(path).suffix == ".aimodel":
            session: Any = get_format("coreai").open_engine(Path(path), str(path))
            session.interface = DecodeInterface(**session.interface_fields())
        else:
            session = open_session(path, (mapping or MappingFile()).for_program(label), str(path))
        sessions.append(session)
    return compare_sessions(
        sessions[0], sessions[1], args.steps, _prompt(args.prompt), args.atol, args.rtol,
        labels=(str(args.a), str(args.b)),
    )  # fmt: skip


def render(result: Any) -> str:
    verdict = "AGREE" if result.agree else f"DIVERGE at step {result.first_divergent_step}"
    lines = [
        f"verify {result.a} vs {result.b}: {verdict}",
        f"  prompt            {result.prompt} then {result.steps} greedy steps",
        f"  tokens a          {result.tokens_a}",
        f"  tokens b          {result.tokens_b}",
        f"  max |logit diff|  {result.max_abs_diff:.6g} (relative {result.max_rel_diff:.3g};"
        f" tolerance {result.atol:g} + {result.rtol:g} x max|logit|)",
    ]
    if result.non_finite:
        lines.insert(1, f"  NON-FINITE        {result.non_finite}")
    for label, interface in (("a", result.interface_a), ("b", result.interface_b)):
        cache = (
            f"cache inputs/outputs={len(interface.caches)}"
            if interface.caches
            else f"states={len(interface.states)}"
        )
        lines.append(
            f"  inputs {label}          token={interface.token} position={interface.position} "
            f"mask={interface.mask} ({interface.mask_kind}) logits={interface.logits} "
            f"context={interface.context} {cache}"
        )
    return "\n".join(lines)
