"""Do two Core ML programs decode the same? Run both in the reference interpreter and compare.

Both programs get the same token sequence: the prompt, then program A's greedy tokens (B is
teacher-forced with A's choices), so every step compares logits for the same context and a
divergence is pinned to the step where it happens instead of snowballing. ``tokens_b`` is B's
greedy choice at each step.

The programs agree when their greedy tokens are identical at every step and every step's largest
logit difference stays within ``atol + rtol * max|logits|`` (fp16 noise); a tolerance breach
alone also counts as a divergence, so two programs that compute different functions are
reported as different even when a tiny model happens to pick the same tokens.

Each program's KV cache is its states or inputs returned whole as outputs
(:func:`decodebench.formats.coreml.cache_io.decode_session`), so the two layouts compare with each other.

A program that yields a non-finite value (an op making NaN or overflowing, or a non-finite
logit) never agrees: the comparison stops there and ``non_finite`` says which program and op.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict

from decodebench.formats.coreml.cache_io import decode_session
from decodebench.formats.coreml.defaults import DEFAULT_ATOL, DEFAULT_PROMPT, DEFAULT_RTOL
from decodebench.formats.coreml.functions import decode_function, prefill_function
from decodebench.formats.coreml.inputs import DecodeInterface, InputMapping, MappingFile
from decodebench.formats.coreml.interpreter import Interpreter, NonFiniteError
from decodebench.formats.coreml.program import MilError, load_package
from decodebench.formats.coreml.session import DecodeSession, Session, chunk_feed, prefill_chunk
from decodebench.formats.seam import NonFiniteValue

# Where the decode loops lived before decodebench.formats.coreml.session; importers keep working.
__all__ = [
    "DecodeSession",
    "Session",
    "VerifyResult",
    "chunk_feed",
    "compare_sessions",
    "load_interpreters",
    "open_session",
    "prefill_chunk",
    "verify_packages",
]

PREFILL_FUNCTION = (
    "prefill"  # what decodebench.formats.coreml.convert names a package's prefill function
)


# Programs loaded in this process, by content: `verify A A` and repeated sessions load once.
_LOADED: dict[str, tuple[Interpreter, Interpreter | None]] = {}
_LOADED_LIMIT = 2


def load_interpreters(path: Path | str) -> tuple[Interpreter, Interpreter | None]:
    """The decode interpreter of a package and its prefill one, if it has one sharing the decode
    function's states (:mod:`decodebench.formats.coreml.functions` chooses both)."""
    key = package_digest(path)
    found = _LOADED.get(key)
    if found is not None:
        return found
    package = load_package(path)
    decode_name = decode_function(package.spec, package.program)
    decode = Interpreter(package.program, decode_name)
    prefill_name = prefill_function(package.program, decode_name)
    prefill = None if prefill_name is None else Interpreter(package.program, prefill_name)
    while len(_LOADED) >= _LOADED_LIMIT:
        _LOADED.pop(next(iter(_LOADED)))
    _LOADED[key] = (decode, prefill)
    return decode, prefill


def package_digest(path: Path | str) -> str:
    """SHA-256 over a package's files (names and contents)."""
    digest = hashlib.sha256()
    root = Path(path)
    for file in sorted(item for item in root.rglob("*") if item.is_file()):
        digest.update(str(file.relative_to(root)).encode() + b"\0")
        with file.open("rb") as handle:
            digest.update(hashlib.file_digest(handle, "sha256").digest())
    return digest.hexdigest()


def open_session(
    path: Path | str, mapping: InputMapping | None = None, label: str | None = None
) -> Session:
    """The decode loop of a package: over its states, or over its KV cache as inputs and
    outputs (:mod:`decodebench.formats.coreml.cache_io`); an error naming the package if it is neither."""
    decode, prefill = load_interpreters(path)
    return decode_session(decode, label or str(path), mapping, prefill)


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
    a: Session,
    b: Session,
    steps: int,
    prompt: Sequence[int] = DEFAULT_PROMPT,
    atol: float = DEFAULT_ATOL,
    rtol: float = DEFAULT_RTOL,
    labels: tuple[str, str] = ("a", "b"),
) -> VerifyResult:
    """Decode ``steps`` tokens after ``prompt`` with both sessions (fresh caches) and compare.

    A step's logits agree when they differ by at most ``atol + rtol * max|logits_a|``.
    """
    _check_comparable(a, b, steps, prompt)
    a.reset()
    b.reset()
    tokens_a: list[int] = []
    tokens_b: list[int] = []
    step_diffs: list[float] = []  # one per generated token
    breaches: list[bool] = []  # one per position: logits further apart than the tolerance
    max_abs, max_scale = 0.0, 0.0
    non_finite: str | None = None
    token = prompt[0]
    rows: list[np.ndarray | None] = [None, None]  # a prefill function's prompt logits
    for position in range(len(prompt) + steps - 1):
        try:
            if position == 0:
                rows = [
                    _finite_prefill(session, label, prompt)
                    if getattr(session, "has_prefill", False)  # any session with step() will do
                    else None
                    for session, label in ((a, labels[0]), (b, labels[1]))
                ]
            logits_a, logits_b = (
                row[position]
                if row is not None and position < len(prompt)
                else _finite_step(session, label, token, position)
                for row, session, label in zip(rows, (a, b), labels, strict=True)
            )
        except NonFiniteValue as error:  # any format's engine
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
    divergent = _first_divergent(tokens_a, tokens_b, breaches, len(prompt), non_finite)
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


def _check_comparable(a: Session, b: Session, steps: int, prompt: Sequence[int]) -> None:
    """An error unless both sessions can decode ``steps`` tokens after ``prompt``."""
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


def _first_divergent(
    tokens_a: list[int],
    tokens_b: list[int],
    breaches: list[bool],
    prompt_length: int,
    non_finite: str | None,
) -> int | None:
    """The first generated step whose tokens differ or whose logits breach the tolerance; a
    breach only in the prompt counts as step 0, a non-finite as the step it stopped at."""
    generated_breaches = breaches[prompt_length - 1 :]
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
    return divergent


def _finite_step(session: Session, label: str, token: int, position: int) -> np.ndarray:
    """One step's logits; NonFiniteError naming the program if an op or a logit is not finite."""
    try:
        logits = session.step(token, position)
    except NonFiniteValue as error:
        raise NonFiniteError(
            f"{label}: {error}", error.op_name, error.op_type, error.function
        ) from error
    if not np.isfinite(logits).all():
        count = int((~np.isfinite(logits)).sum())
        raise NonFiniteError(
            f"{label}: {count} non-finite logits at position {position}", "logits", "output"
        )
    return logits


def _finite_prefill(session: Session, label: str, prompt: Sequence[int]) -> np.ndarray:
    """The prompt's logits through the prefill function; NonFiniteError naming the program."""
    try:
        rows = session.prefill(prompt)
    except NonFiniteValue as error:
        raise NonFiniteError(
            f"{label}: {error}", error.op_name, error.op_type, error.function
        ) from error
    finite = np.isfinite(rows).all(axis=1)
    if not finite.all():
        position = int(np.argmin(finite))
        count = int((~np.isfinite(rows[position])).sum())
        raise NonFiniteError(
            f"{label}: {count} non-finite logits at position {position}", "logits", "output"
        )
    return rows


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
