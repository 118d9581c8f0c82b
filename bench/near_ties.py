"""Where SmolLM2's recipe package and transformers part: the top-two margins, step by step.

    python -m bench.near_ties                    # chat prompts 15 and 17, 16 greedy tokens
    python -m bench.near_ties --prompts 3 15 17 --steps 16

For each chat prompt the package's own fp32 run (the doctor's reference), the repaired package
(fp16, the overflow-safe norms) and transformers fp32 of the checkpoint decode greedily, each
from its own tokens. Printed per prompt: the step where each pair first differs and, at that
step, every decoder's greedy token and runner-up with their logits and gap. A gap below the
decoders' logit error (about 0.19 between fp16 and fp32 on this package) is a near tie: rounding
picks; the package's logits are fp16, so two logits closer than their spacing (2^-6 between 16
and 32) come out equal, and greedy takes the lower id.
"""

from __future__ import annotations

import argparse
import os

import numpy as np

from decodebench.building.realmodels import fetch_model
from decodebench.doctor.checkpoint import load_checkpoint
from decodebench.formats.coreml.cache_io import decode_session
from decodebench.formats.coreml.interpreter import Interpreter
from decodebench.formats.coreml.norm_repair import repair_norms
from decodebench.formats.coreml.program import load_package, quiet_coremltools
from decodebench.formats.coreml.recipe import recipe_package
from decodebench.formats.coreml.widen import widen_program
from decodebench.prompts import chat_prompts, chat_token_ids


def greedy(session, prompt: list[int], steps: int) -> tuple[list[int], list[np.ndarray]]:
    session.reset()
    logits = [session.step(token, position) for position, token in enumerate(prompt)][-1]
    tokens, seen = [int(np.argmax(logits))], [logits]
    for step in range(steps - 1):
        logits = session.step(tokens[-1], len(prompt) + step)
        tokens.append(int(np.argmax(logits)))
        seen.append(logits)
    return tokens, seen


def top_two(logits: np.ndarray) -> str:
    """The greedy token (argmax: the lower id on a tie), the runner-up, their logits' gap."""
    first = int(np.argmax(logits))
    rest = logits.copy()
    rest[first] = -np.inf
    second = int(np.argmax(rest))
    return (
        f"{first} ({logits[first]:.5f}) over {second} ({logits[second]:.5f}), "
        f"gap {logits[first] - logits[second]:.5f}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, nargs="+", default=[15, 17])
    parser.add_argument("--steps", type=int, default=16)
    args = parser.parse_args()

    weights = fetch_model("smollm2-135m")
    texts = [prompt.text for prompt in chat_prompts(max(args.prompts) + 1)]
    with quiet_coremltools():
        package = recipe_package(weights, "state", 256)
        wide = load_package(package).program
        widen_program(wide)
        repaired = load_package(package).program
        repair_norms(repaired)
        decoders = {
            "package fp32": decode_session(Interpreter(wide)),
            "repaired fp16": decode_session(Interpreter(repaired)),
        }
        reference = decoders["package fp32"].interface
        decoders["transformers fp32"] = load_checkpoint(weights, reference.vocab, None, None)
        for index in args.prompts:
            prompt = chat_token_ids(weights, [texts[index]])[0]
            runs = {name: greedy(session, prompt, args.steps) for name, session in decoders.items()}
            print(f"prompt {index}: {texts[index][:60]!r}")
            names = list(runs)
            for a, b in ((0, 1), (0, 2), (1, 2)):
                left, right = runs[names[a]][0], runs[names[b]][0]
                step = next(
                    (i for i, (x, y) in enumerate(zip(left, right, strict=True)) if x != y), None
                )
                if step is None:
                    print(f"  {names[a]} = {names[b]} for {args.steps} tokens")
                    continue
                print(f"  {names[a]} and {names[b]} part at step {step}:")
                for name in (names[a], names[b]):
                    print(f"    {name:18} {top_two(runs[name][1][step])}")
    print(f"load average {os.getloadavg()[0]:.2f} (1 min)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
