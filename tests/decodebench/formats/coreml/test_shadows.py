"""The fp32 shadow of a KV cache updated in place (decodebench.formats.coreml.shadows): attention reads it
instead of widening the fp16 cache, and it always holds exactly the widened cache, also when two
interpreters (a decode and a prefill function) write the same states."""

from __future__ import annotations

import gc

import coremltools as ct
import numpy as np
import pytest
from coremltools.converters.mil import Builder as mb
from coremltools.converters.mil.mil import types

from decodebench.formats.coreml import shadows
from decodebench.formats.coreml.interpreter import Interpreter, NonFiniteError
from decodebench.formats.coreml.plan import READ_STATE_SHARED, SLICE_UPDATE_IN_PLACE

RNG = np.random.default_rng(3)
CACHE = (1, 1, 8, 4)


def attention_step():
    """Write row ``p`` of the key cache, then score a query against the whole cache."""

    @mb.program(
        input_specs=[
            mb.TensorSpec((1,), types.int32),
            mb.TensorSpec((1, 1, 1, 4), types.fp16),
            mb.StateTensorSpec(CACHE, types.fp16),
        ],
        opset_version=ct.target.iOS18,
    )
    def step(p, row, keys):
        begin = mb.concat(values=[[0, 0], p, [0]], axis=0)
        end = mb.concat(values=[[1, 1], mb.add(x=p, y=1), [4]], axis=0)
        cache = mb.slice_update(x=mb.read_state(input=keys), update=row, begin=begin, end=end)
        written = mb.coreml_update_state(state=keys, value=cache)
        return mb.matmul(x=row, y=written, transpose_y=True)

    return step


def test_the_shadow_is_the_widened_cache_and_scores_are_unchanged(monkeypatch) -> None:
    program = attention_step()
    decode, other = Interpreter(program), Interpreter(program)
    states, reference = decode.new_states(), decode.new_states()
    rows = RNG.standard_normal((CACHE[2], 1, 1, 1, 4)).astype(np.float16)
    for position, row in enumerate(rows):
        runner = decode if position % 2 else other  # two interpreters share the states
        feed = {"p": np.array([position], np.int32), "row": row}
        (scores,) = runner.run(feed, states).values()
        with_shadow = shadows.shadow(states["keys"])
        assert with_shadow is not None
        assert with_shadow.tobytes() == states["keys"].astype(np.float32).tobytes()
        with monkeypatch.context() as patch:  # the cache widened by the matmul, as before
            patch.setattr(shadows, "SHADOW_BUDGET", 0)
            (expected,) = runner.run(feed, reference).values()
        assert shadows.shadow(reference["keys"]) is None
        assert scores.tobytes() == expected.tobytes()
    assert decode._plan is not None
    kinds = {step.kind for step in decode._plan.steps}
    assert {READ_STATE_SHARED, SLICE_UPDATE_IN_PLACE} <= kinds


def test_a_replaced_or_dropped_state_loses_its_shadow() -> None:
    storage = np.zeros(CACHE, np.float16)
    shadows.track(storage)
    assert shadows.shadow(storage) is not None
    assert shadows.shadow(storage.copy()) is None
    key = id(storage)
    del storage
    gc.collect()
    assert key not in shadows._shadows
    wide = np.zeros(CACHE, np.float32)
    shadows.track(wide)  # only fp16 storage has one
    assert shadows.shadow(wide) is None


def test_a_cache_checked_whole_stays_known_finite_only_while_finite_slices_are_written() -> None:
    storage = np.zeros(CACHE, np.float16)
    shadows.track(storage)
    assert not shadows.known_finite(storage)  # nothing checked yet
    shadows.mark_finite(storage)
    assert shadows.known_finite(storage)
    assert not shadows.known_finite(storage.copy())  # another array is not the storage
    index = (0, 0, slice(2, 3), slice(None))
    storage[index] = 1.5
    shadows.write(storage, index)
    assert shadows.known_finite(storage)
    wide = shadows.shadow(storage)
    assert wide is not None and wide.tobytes() == storage.astype(np.float32).tobytes()
    storage[index] = np.inf
    shadows.write(storage, index)
    assert not shadows.known_finite(storage)
    shadows.mark_finite(storage)
    shadows.forget(storage)
    assert not shadows.known_finite(storage)


def test_a_nan_written_into_a_cache_known_finite_is_still_named_as_before(monkeypatch) -> None:
    """A cache once checked whole is not scanned again at every read; a NaN written into it
    later is still found, at the same op and with the same message as the op-by-op loop."""
    program = attention_step()
    messages = []
    for compiled in (True, False):
        monkeypatch.setattr(Interpreter, "compile_steps", compiled)
        interpreter = Interpreter(program)
        states = interpreter.new_states()
        rows = RNG.standard_normal((3, 1, 1, 1, 4)).astype(np.float16)
        for position, row in enumerate(rows):
            interpreter.run({"p": np.array([position], np.int32), "row": row}, states)
        if compiled:
            assert shadows.known_finite(states["keys"])
        bad = rows[0].copy()
        bad[..., 1] = np.nan
        with pytest.raises(NonFiniteError) as raised:
            interpreter.run({"p": np.array([3], np.int32), "row": bad}, states)
        messages.append(str(raised.value))
        assert not shadows.known_finite(states["keys"])
    assert messages[0] == messages[1]
    assert "NaN" in messages[0]
