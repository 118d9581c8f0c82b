"""``decodebench repair IN.mlpackage OUT.mlpackage``: repair a program, proven on prompts.

Applies every safe repair (the overflow-safe rewrite of fp16 normalisations, the GQA fold),
proves each against the package's own fp32 run on the chat prompts (each prompt, then
``--steps`` greedy tokens) and keeps a repair only if it improves agreement (the fold: if it does
not make it worse). Prints what changed, the share of prompts with identical tokens, the first
divergent step and the logit error, per candidate. With ``--diagnose`` it also prints the fp16
headroom by layer and role, the first op that overflows, and the avoidable bytes per token
(replicated K/V, copies, KV cache as I/O, fp32 islands, full-context masks, a dominant lm_head)
with their fixes and the predicted tok/s after each, from the same decoding pass.

Prompts need a tokenizer: ``--weights DIR`` (a Hugging Face folder), or ``--model smollm2-135m``
(fetched once). Exit status 0 when OUT was written, 2 on error.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "repair",
        help="repair a saved .mlpackage (fp16-safe norms, GQA fold), proven on prompts",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("source", metavar="IN.mlpackage")
    parser.add_argument("target", metavar="OUT.mlpackage")
    tokenizer = parser.add_mutually_exclusive_group()
    tokenizer.add_argument("--weights", metavar="DIR", help="folder with the tokenizer")
    tokenizer.add_argument(
        "--model", default="smollm2-135m", help="registry model whose tokenizer to use"
    )
    parser.add_argument("--prompts", type=int, default=30, help="chat prompts (default 30)")
    parser.add_argument("--steps", type=int, default=16, help="greedy tokens (default 16)")
    parser.add_argument("--diagnose", action="store_true", help="print the fp16 headroom first")
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object")
    parser.set_defaults(handler=cmd_repair)


def _prompts(args: argparse.Namespace) -> list[list[int]]:
    from decodebench.prompts import CHAT_PROMPT_COUNT, chat_prompts, chat_token_ids, has_tokenizer

    if not 1 <= args.prompts <= CHAT_PROMPT_COUNT:
        raise ValueError(f"--prompts must be between 1 and {CHAT_PROMPT_COUNT}")
    if args.steps < 1:
        raise ValueError("--steps must be at least 1")
    if args.weights:
        weights = Path(args.weights)
    else:
        from decodebench.building.realmodels import fetch_model

        weights = fetch_model(args.model)
    if not has_tokenizer(weights):
        raise ValueError(f"{weights} holds no tokenizer to encode the chat prompts with")
    return chat_token_ids(weights, [prompt.text for prompt in chat_prompts(args.prompts)])


def cmd_repair(args: argparse.Namespace) -> int:
    from decodebench.analysis.analyze import analyze_mlpackage
    from decodebench.doctor.headroom import render as render_headroom
    from decodebench.doctor.repair import Cure
    from decodebench.doctor.repair_text import render
    from decodebench.doctor.waste import find_waste
    from decodebench.doctor.waste import render as render_waste
    from decodebench.formats.coreml.program import MilError, quiet_coremltools

    try:
        if not (Path(args.source) / "Manifest.json").is_file():
            raise MilError(f"{args.source} is not an .mlpackage (no Manifest.json)")
        with quiet_coremltools():
            prompts = _prompts(args)
            waste: list[Any] = []
            # With --diagnose the proof's fp32 run records the headroom: still one pass.
            cure = Cure(args.source, args.target, prompts, args.steps, record_peaks=args.diagnose)
            if args.diagnose:
                analysis = analyze_mlpackage(args.source)
                waste = find_waste(args.source, analysis)
            cured = cure.run()
            headroom, report = cured.headroom, cured.repair
            if headroom is not None and not args.json:
                print("\n".join(render_headroom(headroom)), flush=True)
                print("\n".join(render_waste(waste, analysis)), flush=True)
    except (MilError, ValueError, OSError) as error:
        print(f"decodebench repair: error: {error}", file=sys.stderr)
        if args.json:
            print(json.dumps({"error": str(error)}))
        return 2
    if args.json:
        payload = report.model_dump(mode="json")
        if headroom is not None:
            payload["headroom"] = headroom.model_dump(mode="json")
            payload["waste"] = [item.model_dump(mode="json") for item in waste]
        print(json.dumps(payload, indent=2))
    else:
        print(render(report))
    return 0
