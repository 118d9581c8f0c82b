"""Decode tok/s of repeat_kv against folded attention on this CPU, measured in one run.

The PyTorch reference decoder (decodebench.modeling, fp32, seeded random weights) is stepped
through the same decode protocol as the iOS harness (decodebench.harness.run_prompt): prefill
a few prompt tokens one at a time, then decode greedily; the rate is over pure decode steps.
repeat_kv replicates every KV head G times over the *whole* context buffer on every step (the
`tile` of the Core ML graph); folded reshapes the query instead. Both layouts compute the same
tokens, which is checked.

    python -m bench.host_decode                      # tiny-gqa and exaone-4.0-1.2b
    python -m bench.host_decode --models tiny-gqa --context 2048 --tokens 64

tiny-gqa builds in a second, so its layouts are measured interleaved (A B B A …); EXAONE 4.0
1.2B is 4.8 GB in fp32, so one layout is built, measured and freed before the other, with only a
few tokens each.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from dataclasses import dataclass

import torch

from decodebench.contracts.domain import Attention, VariantSpec
from decodebench.contracts.presets import get_preset
from decodebench.harness import HarnessPrompt, MonotonicClock, run_prompt, warm_up
from decodebench.prompts import builtin_prompts
from emulator.reference import TorchStepEngine, parameter_estimate

LAYOUTS = (Attention.repeat_kv, Attention.folded)
INTERLEAVE_BELOW_PARAMETERS = 100_000_000


@dataclass(frozen=True)
class Plan:
    model: str
    context: int
    prompt_tokens: int
    decode_tokens: int
    repeats: int


DEFAULT_PLANS = {
    "tiny-gqa": Plan("tiny-gqa", context=2048, prompt_tokens=16, decode_tokens=32, repeats=4),
    "exaone-4.0-1.2b": Plan(
        "exaone-4.0-1.2b", context=2048, prompt_tokens=2, decode_tokens=4, repeats=1
    ),
}


@dataclass
class Measured:
    tok_s: list[float]
    tokens: list[int]
    build_s: float


def prompt_for(plan: Plan) -> HarnessPrompt:
    vocab = get_preset(plan.model).vocab_size
    ids = builtin_prompts(1)[0].token_ids(vocab)[: plan.prompt_tokens]
    return HarnessPrompt(index=0, token_ids=ids)


def build(plan: Plan, attention: Attention) -> tuple[TorchStepEngine, float]:
    started = time.perf_counter()
    variant = VariantSpec(attention=attention, context=plan.context)
    engine = TorchStepEngine.build(get_preset(plan.model), variant)
    return engine, time.perf_counter() - started


def once(engine: TorchStepEngine, plan: Plan, prompt: HarnessPrompt) -> tuple[float, list[int]]:
    result = run_prompt(engine, MonotonicClock(), prompt, plan.decode_tokens)
    return result.decode_tok_s, list(result.token_ids or [])


def measure(plan: Plan) -> dict[Attention, Measured]:
    prompt = prompt_for(plan)
    measured: dict[Attention, Measured] = {}
    if parameter_estimate(get_preset(plan.model)) < INTERLEAVE_BELOW_PARAMETERS:
        engines = {}
        for layout in LAYOUTS:
            engine, build_s = build(plan, layout)
            warm_up(engine, prompt.token_ids[0], 2)
            engines[layout] = engine
            measured[layout] = Measured([], [], build_s)
        for repeat in range(plan.repeats):
            order = LAYOUTS if repeat % 2 == 0 else LAYOUTS[::-1]  # A B B A …: drift cancels
            for layout in order:
                tok_s, tokens = once(engines[layout], plan, prompt)
                measured[layout].tok_s.append(tok_s)
                measured[layout].tokens = tokens
        return measured
    for layout in LAYOUTS:
        print(f"  building {plan.model} {layout.value} …", flush=True)
        engine, build_s = build(plan, layout)
        warm_up(engine, prompt.token_ids[0], 1)
        results = [once(engine, plan, prompt) for _ in range(plan.repeats)]
        measured[layout] = Measured([tok_s for tok_s, _ in results], results[-1][1], build_s)
        del engine
        gc.collect()
    return measured


def report(plan: Plan, measured: dict[Attention, Measured]) -> None:
    slow, fast = (statistics.median(measured[layout].tok_s) for layout in LAYOUTS)
    same = measured[Attention.repeat_kv].tokens == measured[Attention.folded].tokens
    print(
        f"{plan.model}: context {plan.context}, {plan.prompt_tokens} prompt + "
        f"{plan.decode_tokens} decoded tokens, {plan.repeats} repeat(s), fp32, "
        f"{torch.get_num_threads()} thread(s)"
    )
    for layout in LAYOUTS:
        rates = ", ".join(f"{rate:.2f}" for rate in measured[layout].tok_s)
        print(
            f"  {layout.value:<9} {statistics.median(measured[layout].tok_s):10.2f} tok/s "
            f"(runs: {rates}; built in {measured[layout].build_s:.1f} s)"
        )
    print(
        f"  folded / repeat_kv = {fast / slow:.2f}x; same greedy tokens: {'yes' if same else 'NO'}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", default=",".join(DEFAULT_PLANS), help="comma-separated presets")
    parser.add_argument("--context", type=int, help="KV-cache length (default per model)")
    parser.add_argument("--tokens", type=int, help="decoded tokens per measurement")
    parser.add_argument("--repeats", type=int, help="measurements per layout")
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    for model in [name.strip() for name in args.models.split(",") if name.strip()]:
        plan = DEFAULT_PLANS.get(model, Plan(model, 512, 4, 8, 1))
        overrides = {"context": args.context, "decode_tokens": args.tokens, "repeats": args.repeats}
        plan = Plan(**{**plan.__dict__, **{k: v for k, v in overrides.items() if v is not None}})
        report(plan, measure(plan))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
