"""A multifunction package's prompt goes through its prefill function, as on a phone; a
decode-only program steps through it. Loaded programs are shared by content in one process."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from decodebench.building.build import PACKAGE_NAME, build_variant
from decodebench.contracts.domain import Attention, KVCache, VariantSpec
from decodebench.formats.coreml import verify
from decodebench.formats.coreml.program import quiet_coremltools
from decodebench.formats.coreml.verify import DecodeSession, compare_sessions, open_session

pytestmark = pytest.mark.slow

CHUNK = 4
PROMPT = [3, 1, 4, 1, 5, 9]  # one chunk through prefill, two tokens stepped


@pytest.fixture(scope="module")
def multifunction(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("prefill")
    variant = VariantSpec(
        attention=Attention.folded, kv=KVCache.state, context=64, prefill_chunk=CHUNK
    )
    with quiet_coremltools():
        build_variant("tiny-gqa", variant, directory)
    return directory / PACKAGE_NAME


def count_runs(monkeypatch: pytest.MonkeyPatch, interpreter: Any, name: str, calls: list) -> None:
    run = interpreter.run

    def counted(feed: Any, states: Any) -> Any:
        calls.append(name)
        return run(feed, states)

    monkeypatch.setattr(interpreter, "run", counted)


def test_the_prompt_goes_through_the_prefill_function(
    multifunction: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = open_session(multifunction)
    assert session.has_prefill
    calls: list[str] = []
    with monkeypatch.context() as patched:
        count_runs(patched, session.prefill_interpreter, "prefill", calls)
        count_runs(patched, session.interpreter, "main", calls)
        rows = session.prefill(PROMPT)
    assert calls == ["prefill", "main", "main"]
    assert rows.shape == (len(PROMPT), session.interface.vocab)

    # The same prompt stepped token by token: the same function, so fp16 noise apart the same
    # logits, the same cache and the same greedy continuation.
    stepped = DecodeSession(session.interpreter, session.interface)
    expected = stepped.prefill(PROMPT)
    scale = float(np.abs(expected).max())
    assert float(np.abs(rows - expected).max()) <= 0.02 + 0.01 * scale
    for name, cache in stepped.states.items():
        written = slice(0, len(PROMPT))
        np.testing.assert_allclose(
            session.states[name][..., written, :].astype(np.float32),
            cache[..., written, :].astype(np.float32),
            atol=2e-2,
        )
    token = int(np.argmax(rows[-1]))
    assert token == int(np.argmax(expected[-1]))
    assert session.next_token(token, len(PROMPT)) == stepped.next_token(token, len(PROMPT))


def test_verify_prefills_both_programs_and_agrees(multifunction: Path) -> None:
    a, b = open_session(multifunction), open_session(multifunction)
    assert a.interpreter is b.interpreter  # loaded once: the same content
    result = compare_sessions(a, b, steps=4, prompt=PROMPT)
    assert result.agree and result.max_abs_diff == 0.0
    assert len(result.tokens_a) == 4


def test_a_decode_only_program_steps_through_the_prompt(tmp_path: Path) -> None:
    variant = VariantSpec(attention=Attention.folded, kv=KVCache.state, context=64)
    with quiet_coremltools():
        build_variant("tiny-gqa", variant, tmp_path)
    session = open_session(tmp_path / PACKAGE_NAME)
    assert not session.has_prefill
    rows = session.prefill(PROMPT)
    session.reset()
    for position, token in enumerate(PROMPT):
        assert np.array_equal(session.step(token, position), rows[position])


def test_loaded_programs_are_kept_by_content(multifunction: Path) -> None:
    verify._LOADED.clear()
    first = verify.load_interpreters(multifunction)
    again = verify.load_interpreters(multifunction)
    assert again[0] is first[0] and again[1] is first[1] is not None
    assert len(verify._LOADED) == 1
