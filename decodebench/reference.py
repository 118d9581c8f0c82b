"""Reference outputs: what transformers in fp32 decodes greedily from a weights folder.

The trusted reference every package's tokens are compared with. Decoding continues past an
end-of-turn token (no early stop), so every prompt yields exactly ``steps`` tokens, the same
count the device runs decode.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path


def reference_outputs(
    weights: Path, prompts: Sequence[Sequence[int]], steps: int
) -> list[list[int]]:
    """Greedy token ids (``steps`` per prompt) of transformers' fp32 model of ``weights``."""
    import torch
    from transformers import AutoModelForCausalLM

    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    model = AutoModelForCausalLM.from_pretrained(str(weights), dtype=torch.float32).eval()
    return [_greedy(model, list(prompt), steps) for prompt in prompts]


def _greedy(model: object, prompt: list[int], steps: int) -> list[int]:
    import torch

    if not prompt:
        raise ValueError("a prompt must hold at least one token")
    generated: list[int] = []
    with torch.no_grad():
        output = model(torch.tensor([prompt]), use_cache=True)  # type: ignore[operator]
        for _ in range(steps):
            token = int(output.logits[0, -1].argmax())
            generated.append(token)
            if len(generated) == steps:
                break
            output = model(  # type: ignore[operator]
                torch.tensor([[token]]), past_key_values=output.past_key_values, use_cache=True
            )
    return generated
