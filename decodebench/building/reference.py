"""Reference outputs: what transformers in fp32 decodes greedily from a weights folder.

The trusted reference every package's tokens are compared with. Decoding continues past an
end-of-turn token (no early stop), so every prompt yields exactly ``steps`` tokens, the same
count the device runs decode.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from decodebench.contracts.build import ReferenceOutputs


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


# --- reference sets for the service: prompts, fp32 answers and a detokenizer, cached ---------
REFERENCE_LABEL = "transformers fp32 greedy"


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet: each byte as one printable character."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    characters = list(printable)
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            characters.append(256 + extra)
            extra += 1
    return dict(zip(printable, (chr(code) for code in characters), strict=True))


def detokenizer_table(weights: Path) -> list[bytes] | None:
    """Each token id's bytes for a byte-level BPE tokenizer (GPT-2, Llama 3, SmolLM2 …), read
    from its ``tokenizer.json``; None for other kinds, whose pieces do not concatenate."""
    import json

    path = weights / "tokenizer.json"
    if not path.is_file():
        return None
    spec = json.loads(path.read_text())
    if (spec.get("decoder") or {}).get("type") != "ByteLevel":
        return None
    to_byte = {character: byte for byte, character in _bytes_to_unicode().items()}
    pieces: dict[int, bytes] = {}
    for token, index in spec["model"]["vocab"].items():
        if not all(character in to_byte for character in token):
            return None
        pieces[int(index)] = bytes(to_byte[character] for character in token)
    for added in spec.get("added_tokens", ()):  # special tokens read as themselves
        pieces[int(added["id"])] = str(added["content"]).encode()
    return [pieces.get(index, b"") for index in range(max(pieces) + 1)]


def reference_set(
    weights: Path,
    model_identity: str,
    texts: Sequence[str],
    decode_tokens: int,
    identity: dict[str, object],
    prompt_set: str,
    cache: Path | None = None,
    max_prompt_tokens: int | None = None,
) -> tuple[ReferenceOutputs, list[bytes] | None]:
    """The prompts through the model's chat template and transformers' fp32 greedy answers,
    remembered under ``cache`` by (model identity, prompt set, decode tokens): a sweep's
    variants share one computation. Also the model's detokenizer table, checked to reproduce
    the tokenizer's own decoding of every answer (None when it cannot). A prompt longer than
    ``max_prompt_tokens`` keeps its last ones, as the device is given it (``agent.runner``)."""
    import hashlib
    import json
    import os
    import time

    from transformers import AutoTokenizer

    from decodebench.contracts.build import ReferenceOutputs, ReferencePrompt
    from decodebench.prompts import chat_token_ids

    key = hashlib.sha256(
        json.dumps(
            {
                "model": model_identity,
                "identity": identity,
                "texts": list(texts),
                "max_prompt_tokens": max_prompt_tokens,
            },
            sort_keys=True,
        ).encode()
    ).hexdigest()
    stored = cache / f"references-{key}.json" if cache is not None else None
    table = detokenizer_table(weights)
    if stored is not None and stored.is_file():
        outputs = ReferenceOutputs.model_validate_json(stored.read_text())
        return outputs, _checked(table, outputs)
    started = time.perf_counter()
    token_ids = chat_token_ids(weights, texts)
    if max_prompt_tokens is not None:
        token_ids = [ids[-max_prompt_tokens:] for ids in token_ids]
    answers = reference_outputs(weights, token_ids, decode_tokens)
    tokenizer = AutoTokenizer.from_pretrained(str(weights))
    decoded = [
        str(tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False))
        for ids in answers
    ]
    outputs = ReferenceOutputs(
        reference=REFERENCE_LABEL,
        prompt_set=prompt_set,
        identity=identity,
        decode_tokens=decode_tokens,
        prompts=[
            ReferencePrompt(
                index=index, text=text, token_ids=ids, reference_ids=answer, reference_text=shown
            )
            for index, (text, ids, answer, shown) in enumerate(
                zip(texts, token_ids, answers, decoded, strict=True)
            )
        ],
        seconds=round(time.perf_counter() - started, 3),
    )
    if stored is not None:
        stored.parent.mkdir(parents=True, exist_ok=True)
        partial = stored.with_name(f"{stored.name}.{os.getpid()}.partial")  # one per writer
        partial.write_text(outputs.model_dump_json())
        partial.replace(stored)
    return outputs, _checked(table, outputs)


def _checked(table: list[bytes] | None, outputs: ReferenceOutputs) -> list[bytes] | None:
    """The table, if its pieces reproduce the tokenizer's text of every answer; else None
    (no text is better than wrong text)."""
    from decodebench.detokenize import detokenize

    if table is None:
        return None
    for prompt in outputs.prompts:
        if detokenize(table, prompt.reference_ids) != prompt.reference_text:
            return None
    return table
