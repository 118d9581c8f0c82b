"""Do our packages decode what the fp32 reference decodes? Greedy tokens, prompt by prompt.

A Core AI asset is decoded on its format's engine (:class:`EngineDecoder`); the rest of this
page is Core ML's.

:class:`PackageDecoder` runs one of decodebench's own packages in the reference interpreter with
either KV mode: with ``kv="state"`` the cache is the program's states; with ``kv="input"`` this
host keeps it, feeds it in and writes each step's new K and V (``key_{i}`` / ``value_{i}``) at
the step's position, as the device harness does. A package made elsewhere that passes its whole
caches in and out (the older converters' layout) is driven by
:class:`decodebench.formats.coreml.cache_io.CacheIoSession`. Every op is checked for non-finite values.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict

from decodebench.formats import get_format
from decodebench.formats.coreml.cache_io import cache_pairs, decode_session
from decodebench.formats.coreml.inputs import recognise
from decodebench.formats.coreml.interpreter import Interpreter, NonFiniteError
from decodebench.formats.coreml.program import MilError, load_package
from decodebench.formats.coreml.session import Session
from decodebench.formats.coreml.verify import DecodeSession
from decodebench.formats.seam import NonFiniteValue, StepEngine

CACHE_PREFIXES = ("key_cache_", "value_cache_")


class PackageDecoder:
    """Greedy decoding of a decodebench package (either KV mode) in the interpreter."""

    def __init__(self, package: Path | str) -> None:
        self.interpreter = Interpreter(load_package(package).program)
        self.session: DecodeSession | Session | None = None
        self.caches: dict[str, np.ndarray] = {}
        if self.interpreter.states:
            self.session = DecodeSession(self.interpreter, recognise(self.interpreter))
            return
        names = [name for name in self.interpreter.inputs if name.startswith(CACHE_PREFIXES)]
        if (not names or "input_ids" not in self.interpreter.inputs) and cache_pairs(
            self.interpreter
        ):
            self.session = decode_session(self.interpreter, str(package))
            return
        if not names or "input_ids" not in self.interpreter.inputs:
            raise MilError(
                f"{package}: neither KV states, key_cache_/value_cache_ inputs, nor caches "
                "passed in and out whole"
            )
        self.cache_names = names
        self.context = self.interpreter.inputs[names[0]].shape[-2]

    def reset(self) -> None:
        if self.session is not None:
            self.session.reset()
            return
        self.caches = {
            name: np.zeros(spec.shape, spec.dtype)
            for name, spec in self.interpreter.inputs.items()
            if name in self.cache_names
        }

    def logits(self, token: int, position: int) -> np.ndarray:
        """fp32 logits [vocab] after ``token`` at ``position``."""
        if self.session is not None:
            return self.session.step(token, position)
        inputs = self.interpreter.inputs
        mask = np.where(np.arange(self.context) < position, 0.0, -np.inf)  # own token apart
        feed: dict[str, np.ndarray] = {
            "input_ids": np.full(inputs["input_ids"].shape, token, inputs["input_ids"].dtype),
            "position": np.full(inputs["position"].shape, position, inputs["position"].dtype),
            "causal_mask": np.broadcast_to(mask, inputs["causal_mask"].shape).astype(
                inputs["causal_mask"].dtype
            ),
            **self.caches,
        }
        outputs = self.interpreter.run(feed)
        for name, cache in self.caches.items():
            new = outputs[name.replace("_cache_", "_")]
            cache[:, :, position : position + new.shape[2], :] = new
        logits = np.asarray(outputs["logits"], dtype=np.float32)
        return logits.reshape(-1, logits.shape[-1])[-1]

    def greedy(self, prompt: Sequence[int], steps: int) -> list[int]:
        """Feed ``prompt`` token by token, then pick the argmax ``steps`` times."""
        self.reset()
        generated: list[int] = []
        token = prompt[0]
        for position in range(len(prompt) + steps - 1):
            logits = self.logits(token, position)
            if not np.isfinite(logits).all():
                raise NonFiniteError(
                    f"non-finite logits at position {position}", "logits", "output"
                )
            if position + 1 < len(prompt):
                token = prompt[position + 1]
                continue
            token = int(np.argmax(logits))
            generated.append(token)
        return generated


class PromptAgreement(BaseModel):
    model_config = ConfigDict(frozen=True)

    index: int
    prompt_tokens: int
    reference: list[int]
    tokens: list[int]
    # Greedy decoding feeds its own choices back: after the first difference the two texts
    # continue from different contexts, so only the prefix up to it is comparable.
    matching_prefix: int
    non_finite: str | None = None

    @property
    def agree(self) -> bool:
        return self.non_finite is None and self.tokens == self.reference


class AgreementReport(BaseModel):
    model_config = ConfigDict(frozen=True)

    package: str
    steps: int
    prompts: list[PromptAgreement]

    @property
    def agreeing(self) -> int:
        return sum(result.agree for result in self.prompts)

    @property
    def non_finite(self) -> int:
        return sum(result.non_finite is not None for result in self.prompts)

    @property
    def token_agreement(self) -> float:
        """Matching prefix tokens over all reference tokens."""
        total = sum(len(result.reference) for result in self.prompts)
        return sum(result.matching_prefix for result in self.prompts) / total if total else 0.0


class EngineDecoder:
    """Greedy decoding on any format's step engine (a Core AI asset on the project's engine)."""

    def __init__(self, engine: StepEngine) -> None:
        self.engine = engine

    def greedy(self, prompt: Sequence[int], steps: int) -> list[int]:
        self.engine.reset()
        generated: list[int] = []
        token = prompt[0]
        for position in range(len(prompt) + steps - 1):
            logits = self.engine.step(token, position)
            if not np.isfinite(logits).all():
                raise NonFiniteValue(
                    f"non-finite logits at position {position}", "logits", "output"
                )
            if position + 1 < len(prompt):
                token = prompt[position + 1]
                continue
            token = int(np.argmax(logits))
            generated.append(token)
        return generated


def package_decoder(package: Path | str) -> PackageDecoder | EngineDecoder:
    """The greedy decoder of a package of either format (by its name: ``.aimodel`` is Core AI)."""
    if Path(package).suffix == ".aimodel":
        return EngineDecoder(get_format("coreai").open_engine(Path(package)))
    return PackageDecoder(package)


def matching_prefix(left: Sequence[int], right: Sequence[int]) -> int:
    count = 0
    for a, b in zip(left, right, strict=False):
        if a != b:
            break
        count += 1
    return count


def measure_agreement(
    package: Path | str,
    prompts: Sequence[Sequence[int]],
    references: Sequence[Sequence[int]],
    steps: int,
) -> AgreementReport:
    """Decode every prompt with ``package`` and compare with its reference tokens."""
    if len(prompts) != len(references):
        raise ValueError(f"{len(prompts)} prompts but {len(references)} reference outputs")
    decoder = package_decoder(package)
    results = []
    for index, (prompt, reference) in enumerate(zip(prompts, references, strict=True)):
        non_finite = None
        try:
            tokens = decoder.greedy(prompt, steps)
        except NonFiniteValue as error:
            tokens, non_finite = [], str(error)
        results.append(
            PromptAgreement(
                index=index,
                prompt_tokens=len(prompt),
                reference=list(reference),
                tokens=tokens,
                matching_prefix=matching_prefix(tokens, reference),
                non_finite=non_finite,
            )
        )
    return AgreementReport(package=str(package), steps=steps, prompts=results)
