"""The project's Core AI engine: it decodes the tokens of the trusted reference (the same
decoder in torch fp32), it is held op by op to Apple's runtime, and it names the op that makes
a non-finite value."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from decodebench.contracts.presets import get_preset
from decodebench.modeling import DecodeStepModel
from decodebench.modeling.host import HostCache, run_call

from .conftest import CONTEXT

pytestmark = pytest.mark.slow
PROMPT = [1, 5, 9, 13]
STEPS = 8


def _reference_tokens(attention: str) -> list[int]:
    model = DecodeStepModel(get_preset("tiny-gqa"), CONTEXT, attention, torch.float32, "input")
    host = HostCache(model)
    for position, token in enumerate(PROMPT[:-1]):
        run_call(model, [token], position, host)
    token, position, tokens = PROMPT[-1], len(PROMPT) - 1, []
    for _ in range(STEPS):
        token = int(run_call(model, [token], position, host)[-1].argmax())
        tokens.append(token)
        position += 1
    return tokens


@pytest.mark.parametrize("attention", ["repeat_kv", "folded"])
def test_the_fp16_asset_decodes_the_fp32_reference_tokens(
    coreai_assets: dict[str, Path], attention: str
) -> None:
    from decodebench.formats.coreai.session import open_session

    session = open_session(coreai_assets[attention])
    session.prefill(PROMPT[:-1])
    token, position, tokens = PROMPT[-1], len(PROMPT) - 1, []
    for _ in range(STEPS):
        token = session.next_token(token, position)
        tokens.append(token)
        position += 1
    assert tokens == _reference_tokens(attention)


def _session_at_step(path: Path):  # type: ignore[no-untyped-def]
    from decodebench.formats.coreai.session import open_session

    session = open_session(path)
    session.prefill(PROMPT[:2])
    return session, session.feeds_at(PROMPT[2], 2)


@pytest.mark.parametrize("attention", ["repeat_kv", "folded"])
def test_every_op_of_a_decode_step_agrees_with_apples_runtime(
    coreai_assets: dict[str, Path], attention: str
) -> None:
    from decodebench.formats.coreai.arbiter import hold_to_runtime

    session, feeds = _session_at_step(coreai_assets[attention])
    report = hold_to_runtime(session.program, session.engine.function, feeds)
    # The ops the engine folds once (the transposed weights) are held too.
    assert report.ops == len(session.engine.steps) + len(session.engine.folded)
    assert len(session.engine.steps) > 250
    # fp16 results (matrix products included) bit-exact; fp32 ones within a few ulps.
    assert report.exact >= 0.9 * report.ops
    assert report.by_kind["broadcasting_batch_matmul"] > 0


def test_the_arbiter_names_an_op_the_engine_computes_wrongly(
    coreai_assets: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from decodebench.formats.coreai import engine as engine_module
    from decodebench.formats.coreai.arbiter import Disagreement, hold_to_runtime
    from decodebench.formats.coreai.kernels import KERNELS

    right = KERNELS["silu"]
    monkeypatch.setitem(KERNELS, "silu", lambda values: right(values) * np.float32(1.01))
    monkeypatch.setattr(engine_module, "KERNELS", KERNELS)
    session, feeds = _session_at_step(coreai_assets["folded"])
    with pytest.raises(Disagreement, match=r"'silu_\d+' \(silu -> float16"):
        hold_to_runtime(session.program, session.engine.function, feeds)


def test_a_whole_step_in_apples_runtime_gives_the_engines_logits(
    coreai_assets: dict[str, Path],
) -> None:
    from decodebench.formats.coreai import runtime

    session, feeds = _session_at_step(coreai_assets["folded"])
    theirs = runtime.run(session.program.path, "main", [feeds])[0]["logits"].astype(np.float32)
    mine = session.engine.run(feeds)["logits"]
    # The engine sums fp16 products in fp32 where the runtime rounds each partial sum.
    assert np.argmax(mine) == np.argmax(theirs)
    assert float(np.max(np.abs(mine - theirs))) < 0.05


def test_an_fp16_overflow_is_refused_naming_the_op(coreai_assets: dict[str, Path]) -> None:
    from decodebench.formats.coreai.engine import NonFiniteError

    session, feeds = _session_at_step(coreai_assets["folded"])
    feeds["key_cache_0"] = np.full_like(feeds["key_cache_0"], 60000.0)
    feeds["causal_mask"] = np.zeros_like(feeds["causal_mask"])
    with pytest.raises(NonFiniteError, match=r"op #\d+ '\w+_\d+' \(\w+ -> float16\[") as raised:
        session.engine.run(feeds)
    assert raised.value.op_type


def test_a_program_input_of_the_wrong_shape_is_refused_by_name(
    coreai_assets: dict[str, Path],
) -> None:
    from decodebench.formats.coreai.program import CoreAIError

    session, feeds = _session_at_step(coreai_assets["folded"])
    feeds["key_cache_1"] = feeds["key_cache_1"][:, :, :3]
    with pytest.raises(CoreAIError, match=r"input 'key_cache_1' has shape \[1, 8, 3, 64\]"):
        session.engine.run(feeds)
