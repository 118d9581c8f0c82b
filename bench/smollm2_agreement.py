"""Do SmolLM2-135M's fp16 packages decode what transformers decodes in fp32?

For every variant (both attention layouts x both KV modes in fp16, then the quant recipes on
the folded / state layout) the package is built (or taken from the build cache), and each chat
prompt is decoded greedily in the reference interpreter, every op checked for non-finite values;
its tokens are compared with transformers' fp32 greedy tokens for the same prompt.

    python -m bench.smollm2_agreement                       # 30 prompts x 16 tokens, 8 variants
    python -m bench.smollm2_agreement --prompts 5 --variants folded/state repeat_kv/input
    python -m bench.smollm2_agreement --json                # one JSON object
    python -m bench.smollm2_agreement --prompts 2 --quant-only --budget-minutes 20
    python -m bench.smollm2_agreement --core-ai             # the Core AI builds, on its engine

``--quant-only`` measures the recipes (w8, w4, base, top8 on folded / state) against the same
fp32 reference; ``--budget-minutes`` stops starting variants once the budget is spent (those
left are listed as not measured); ``--answers`` prints each diverging prompt's reference and
variant text.

Prints one row per variant: prompts whose 16 tokens all equal the reference, prompts with a
non-finite value, and the share of reference tokens matched before the first difference.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from decodebench.building.agreement import AgreementReport, measure_agreement
from decodebench.building.build import build_variant
from decodebench.building.cache import BuildCache
from decodebench.building.realmodels import fetch_model
from decodebench.building.reference import reference_outputs
from decodebench.contracts.domain import VariantSpec
from decodebench.formats.coreml.program import quiet_coremltools
from decodebench.prompts import CHAT_PROMPT_COUNT, chat_prompts, prompt_token_ids

LAYOUT_VARIANTS = ("repeat_kv/state", "folded/state", "repeat_kv/input", "folded/input")
QUANT_VARIANTS = ("folded/state/w8", "folded/state/w4", "folded/state/base", "folded/state/top8")


CORE_AI_VARIANTS = ("coreai:repeat_kv/input", "coreai:folded/input")


def parse_variant(text: str, context: int) -> VariantSpec:
    """``folded/state/w8``, or with a format first: ``coreai:folded/input``."""
    model_format, _, layout = text.rpartition(":")
    attention, kv, *quant = layout.split("/")
    return VariantSpec(
        format=model_format or "coreml", attention=attention, kv=kv, context=context,
        quant=quant[0] if quant else "fp16",
    )  # fmt: skip


def references(weights: Path, prompts: list[list[int]], steps: int, store: Path) -> list[list[int]]:
    """transformers' fp32 tokens, remembered per (prompts, steps) since they never change."""
    key = json.dumps({"prompts": prompts, "steps": steps})
    if store.is_file():
        saved = json.loads(store.read_text())
        if saved.get("key") == key:
            return saved["tokens"]
    tokens = reference_outputs(weights, prompts, steps)
    store.parent.mkdir(parents=True, exist_ok=True)
    store.write_text(json.dumps({"key": key, "tokens": tokens}))
    return tokens


def row(name: str, report: AgreementReport, seconds: float) -> dict[str, object]:
    return {
        "variant": name,
        "prompts": len(report.prompts),
        "identical": report.agreeing,
        "non_finite": report.non_finite,
        "token_agreement": round(report.token_agreement, 4),
        "first_divergence": {
            result.index: result.matching_prefix for result in report.prompts if not result.agree
        },
        "seconds": round(seconds, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=CHAT_PROMPT_COUNT)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--variants", nargs="+", default=[*LAYOUT_VARIANTS, *QUANT_VARIANTS])
    parser.add_argument(
        "--work", default=str(Path.home() / ".cache/decodebench/building/agreement")
    )
    parser.add_argument("--no-cache", action="store_true", help="build every variant afresh")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--quant-only", action="store_true", help="w8, w4, base, top8 only")
    parser.add_argument("--core-ai", action="store_true", help="the Core AI builds only")
    parser.add_argument("--budget-minutes", type=float, default=None)
    parser.add_argument("--answers", action="store_true", help="print diverging answers")
    args = parser.parse_args()
    if args.quant_only:
        args.variants = list(QUANT_VARIANTS)
    if args.core_ai:
        args.variants = list(CORE_AI_VARIANTS)
    deadline = time.monotonic() + 60 * args.budget_minutes if args.budget_minutes else None

    weights = fetch_model("smollm2-135m")
    prompts = prompt_token_ids(chat_prompts(args.prompts), 49152, weights)
    work = Path(args.work)
    expected = references(weights, prompts, args.steps, work / "references.json")
    # The build key names the model, variant and toolchain, not this repository's code: pass
    # --no-cache after changing the graph code (a stale package would be measured otherwise).
    cache = None if args.no_cache else BuildCache()
    rows = []
    skipped = []
    for name in args.variants:
        if deadline is not None and time.monotonic() > deadline:
            skipped.append(name)
            continue
        variant = parse_variant(name, args.context)
        started = time.perf_counter()
        out = work / name.replace("/", "-").replace(":", "-")
        with quiet_coremltools():
            built = build_variant("smollm2-135m", variant, out, weights=weights, cache=cache)
            report = measure_agreement(out / built.package, prompts, expected, args.steps)
        rows.append(row(name, report, time.perf_counter() - started))
        if not args.json:
            line = rows[-1]
            print(
                f"{name:22} identical {line['identical']:>2}/{line['prompts']}  "
                f"non-finite {line['non_finite']}  token agreement {line['token_agreement']:.3f}"
                f"  first divergence {line['first_divergence']}  ({line['seconds']} s)",
                flush=True,
            )
            if args.answers:
                print_answers(weights, report)
    if args.json:
        document = {"steps": args.steps, "context": args.context, "variants": rows}
        print(json.dumps({**document, "not_measured": skipped}, indent=2))
    elif skipped:
        print(f"not measured (budget spent): {', '.join(skipped)}")
    return 0


def print_answers(weights: Path, report: AgreementReport) -> None:
    from decodebench.prompts import decode_text

    for result in report.prompts:
        if result.agree:
            continue
        print(f"    prompt {result.index}: reference {decode_text(weights, result.reference)!r}")
        print(f"    {'':>9} variant   {decode_text(weights, result.tokens)!r}")


if __name__ == "__main__":
    raise SystemExit(main())
