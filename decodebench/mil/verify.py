"""Do two Core ML programs decode the same? Run both in the reference interpreter and compare.

Both programs get the same token sequence: the prompt, then program A's greedy tokens (B is
teacher-forced with A's choices), so every step compares logits for the same context and a
divergence is pinned to the step where it happens instead of snowballing. ``tokens_b`` is B's
greedy choice at each step.

The programs agree when their greedy tokens are identical at every step and every step's largest
logit difference stays within ``atol + rtol * max|logits|`` (fp16 noise); a tolerance breach
alone also counts as a divergence, so two programs that compute different functions are
reported as different even when a tiny model happens to pick the same tokens.

A program that yields a non-finite value (an op making NaN or overflowing, or a non-finite
logit) never agrees: the comparison stops there and ``non_finite`` says which program and op.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict

from decodebench.mil.defaults import DEFAULT_ATOL, DEFAULT_PROMPT, DEFAULT_RTOL
from decodebench.mil.inputs import DecodeInterface, InputMapping, MappingFile, recognise, step_feed
from decodebench.mil.interpreter import Interpreter, NonFiniteError
from decodebench.mil.program import MilError, load_package


class DecodeSession:
    """One program's decode loop: a KV cache (the states) and a step function."""

    def __init__(self, interpreter: Interpreter, interface: DecodeInterface) -> None:
        self.interpreter = interpreter
        self.interface = interface
        self.states = interpreter.new_states()

    def reset(self) -> None:
        self.states = self.interpreter.new_states()

    def step(self, token: int, position: int) -> np.ndarray:
        """Logits [vocab] (fp32) after writing ``token`` at ``position``."""
        feed = step_feed(self.interpreter, self.interface, token, position)
        outputs = self.interpreter.run(feed, self.states)
        logits = np.asarray(outputs[self.interface.logits], dtype=np.float32)
        return logits.reshape(-1, self.interface.vocab)[-1]

    def next_token(self, token: int, position: int) -> int:
        """The greedy token after ``token`` at ``position`` (a harness token source)."""
        return int(np.argmax(self.step(token, position)))


def open_session(
    path: Path | str, mapping: InputMapping | None = None, label: str | None = None
) -> DecodeSession:
    package = load_package(path)
    interpreter = Interpreter(package.program)
    return DecodeSession(interpreter, recognise(interpreter, mapping, label or str(path)))


class VerifyResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    a: str
    b: str
    prompt: list[int]
    steps: int
    tokens_a: list[int]
    tokens_b: list[int]
    max_abs_diff: float
    max_rel_diff: float
    step_max_abs_diff: list[float]
    first_divergent_step: int | None
    atol: float
    rtol: float
    agree: bool
    non_finite: str | None = None
    interface_a: DecodeInterface
    interface_b: DecodeInterface


def compare_sessions(
    a: DecodeSession,
    b: DecodeSession,
    steps: int,
    prompt: Sequence[int] = DEFAULT_PROMPT,
    atol: float = DEFAULT_ATOL,
    rtol: float = DEFAULT_RTOL,
    labels: tuple[str, str] = ("a", "b"),
) -> VerifyResult:
    """Decode ``steps`` tokens after ``prompt`` with both sessions (fresh caches) and compare.

    A step's logits agree when they differ by at most ``atol + rtol * max|logits_a|``.
    """
    if steps < 1:
        raise MilError("--steps must be at least 1")
    if not prompt:
        raise MilError("the prompt must hold at least one token")
    if a.interface.vocab != b.interface.vocab:
        raise MilError(
            f"the programs have different vocabularies ({a.interface.vocab} vs "
            f"{b.interface.vocab} logits)"
        )
    context = min(a.interface.context, b.interface.context)
    if len(prompt) + steps - 1 > context:
        raise MilError(f"{len(prompt)} prompt + {steps} steps exceed the context of {context}")
    a.reset()
    b.reset()
    tokens_a: list[int] = []
    tokens_b: list[int] = []
    step_diffs: list[float] = []  # one per generated token
    breaches: list[bool] = []  # one per position: logits further apart than the tolerance
    max_abs, max_scale = 0.0, 0.0
    non_finite: str | None = None
    token = prompt[0]
    for position in range(len(prompt) + steps - 1):
        try:
            logits_a = _finite_step(a, labels[0], token, position)
            logits_b = _finite_step(b, labels[1], token, position)
        except NonFiniteError as error:
            non_finite = str(error)
            breaches.append(True)
            break
        difference = float(np.max(np.abs(logits_a - logits_b)))
        scale = float(np.max(np.abs(logits_a)))
        max_abs, max_scale = max(max_abs, difference), max(max_scale, scale)
        breaches.append(not difference <= atol + rtol * scale)  # NaN counts as a breach
        if position + 1 < len(prompt):
            token = prompt[position + 1]
            continue
        step_diffs.append(difference)
        tokens_a.append(int(np.argmax(logits_a)))
        tokens_b.append(int(np.argmax(logits_b)))
        token = tokens_a[-1]
    generated_breaches = breaches[len(prompt) - 1 :]
    divergent = next(
        (
            step
            for step, (left, right) in enumerate(zip(tokens_a, tokens_b, strict=True))
            if left != right or generated_breaches[step]
        ),
        None,
    )
    if divergent is None and any(breaches):  # only the prompt steps (or a non-finite) disagree
        divergent = len(tokens_a) if non_finite else 0
    return VerifyResult(
        a=labels[0],
        b=labels[1],
        prompt=list(prompt),
        steps=steps,
        tokens_a=tokens_a,
        tokens_b=tokens_b,
        max_abs_diff=max_abs,
        max_rel_diff=max_abs / max_scale if max_scale else 0.0,
        step_max_abs_diff=step_diffs,
        first_divergent_step=divergent,
        atol=atol,
        rtol=rtol,
        agree=divergent is None,
        non_finite=non_finite,
        interface_a=a.interface,
        interface_b=b.interface,
    )


def _finite_step(session: DecodeSession, label: str, token: int, position: int) -> np.ndarray:
    """One step's logits; NonFiniteError naming the program if an op or a logit is not finite."""
    try:
        logits = session.step(token, position)
    except NonFiniteError as error:
        raise NonFiniteError(f"{label}: {error}", error.op_name, error.op_type) from error
    if not np.isfinite(logits).all():
        count = int((~np.isfinite(logits)).sum())
        raise NonFiniteError(
            f"{label}: {count} non-finite logits at position {position}", "logits", "output"
        )
    return logits


def verify_packages(
    path_a: Path | str,
    path_b: Path | str,
    steps: int,
    prompt: Sequence[int] = DEFAULT_PROMPT,
    mapping: MappingFile | None = None,
    atol: float = DEFAULT_ATOL,
    rtol: float = DEFAULT_RTOL,
) -> VerifyResult:
    mapping = mapping or MappingFile()
    session_a = open_session(path_a, mapping.for_program("a"), str(path_a))
    session_b = open_session(path_b, mapping.for_program("b"), str(path_b))
    return compare_sessions(
        session_a, session_b, steps, prompt, atol, rtol, labels=(str(path_a), str(path_b))
    )
