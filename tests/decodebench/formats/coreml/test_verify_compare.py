"""How verify decides agreement, on scripted logits (no conversion, no interpreter)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from decodebench.formats.coreml.inputs import DecodeInterface
from decodebench.formats.coreml.program import MilError
from decodebench.formats.coreml.verify import compare_sessions

VOCAB = 8


class Scripted:
    """A decode session whose logits at each position are given; records what it was fed."""

    def __init__(self, logits: dict[int, np.ndarray], context: int = 16) -> None:
        self.logits = logits
        self.fed: list[tuple[int, int]] = []
        self.interface = DecodeInterface(
            token="t",
            position="p",
            mask=None,
            mask_kind="additive",
            logits="l",
            context=context,
            vocab=VOCAB,
            states=["k"],
        )

    def reset(self) -> None:
        self.fed.clear()

    def step(self, token: int, position: int) -> np.ndarray:
        self.fed.append((token, position))
        return self.logits.get(position, np.eye(VOCAB, dtype=np.float32)[(position + 3) % VOCAB])


def one_hot(index: int, scale: float = 1.0) -> np.ndarray:
    return np.eye(VOCAB, dtype=np.float32)[index] * scale


def test_b_is_teacher_forced_with_a_tokens() -> None:
    a = Scripted({})
    b = Scripted({3: one_hot(5)})  # B would pick 5 at position 3, A picks 6
    result = compare_sessions(a, b, steps=3, prompt=[1, 2])
    assert result.tokens_a == [4, 5, 6] and result.tokens_b == [4, 5, 5]
    assert b.fed == a.fed == [(1, 0), (2, 1), (4, 2), (5, 3)]
    assert (result.first_divergent_step, result.agree) == (2, False)


def test_tolerance_is_absolute_plus_relative_to_the_logits() -> None:
    big = {position: one_hot((position + 3) % VOCAB, 30.0) for position in range(4)}
    nudged = {position: value + 0.25 * (np.arange(VOCAB) == 0) for position, value in big.items()}
    # 0.25 apart on logits of 30: within 0.02 + 0.01 * 30, same tokens -> agree.
    result = compare_sessions(Scripted(big), Scripted(nudged), steps=3, prompt=[1, 2])
    assert result.agree and result.max_abs_diff == pytest.approx(0.25)
    assert result.max_rel_diff == pytest.approx(0.25 / 30)
    # Without the relative part the same difference is a divergence, tokens notwithstanding.
    strict = compare_sessions(Scripted(big), Scripted(nudged), steps=3, prompt=[1, 2], rtol=0.0)
    assert not strict.agree and strict.first_divergent_step == 0
    assert strict.tokens_a == strict.tokens_b


def test_prompt_only_and_nan_differences_diverge() -> None:
    prompt_only = Scripted({0: one_hot(3) + 1.0})
    result = compare_sessions(Scripted({}), prompt_only, steps=2, prompt=[1, 2])
    assert result.step_max_abs_diff == [0.0, 0.0] and result.first_divergent_step == 0

    nan = Scripted({2: np.full(VOCAB, math.nan, np.float32)})
    result = compare_sessions(Scripted({}), nan, steps=2, prompt=[1, 2])
    assert result.first_divergent_step == 1 and not result.agree


def test_bad_requests_are_errors() -> None:
    with pytest.raises(MilError, match="--steps must be at least 1"):
        compare_sessions(Scripted({}), Scripted({}), steps=0)
    with pytest.raises(MilError, match="exceed the context of 4"):
        compare_sessions(Scripted({}, context=4), Scripted({}), steps=4, prompt=[1, 2])
