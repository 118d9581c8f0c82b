"""Property-based: whatever a client sends — a sweep spec, a quant recipe, a run's results —
the real server answers 2xx or 4xx, never 5xx, and a 4xx writes nothing."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from decodebench.contracts.recipes import RecipeError, parse_recipe
from tests.support.api import bearer
from tests.support.services import table_counts
from tests.support.sweeps import SWEEP, result_for

BOUNDED = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
)
JSON = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


def mutated(base: dict[str, Any], paths: list[tuple]) -> st.SearchStrategy[dict[str, Any]]:
    """A valid document with one field (at any depth listed) replaced, removed, or left alone."""

    @st.composite
    def build(draw: st.DrawFn) -> dict[str, Any]:
        import copy

        document = copy.deepcopy(base)
        path = draw(st.sampled_from(paths))
        parent = document
        for key in path[:-1]:
            parent = parent[key]
        action = draw(st.sampled_from(("replace", "remove", "keep")))
        if action == "replace":
            parent[path[-1]] = draw(JSON)
        elif action == "remove" and isinstance(parent, dict):
            parent.pop(path[-1], None)
        return document

    return build()


def _send(api, method: str, url: str, body: Any, token: str, watched: tuple[str, ...]) -> None:
    before = table_counts()
    # Encoded here, as any client could: NaN and lone surrogates (as \\ud800 escapes) go out too.
    headers = bearer(token) | {"Content-Type": "application/json"}
    response = api.request(method, url, content=json.dumps(body), headers=headers)
    assert response.status_code < 500, (body, response.text)
    if response.status_code >= 400:
        after = table_counts()
        assert {t: after[t] for t in watched} == {t: before[t] for t in watched}, body


SPEC_PATHS = [
    ("model",), ("variants",), ("variants", 0), ("variants", 0, "attention"),
    ("variants", 0, "context"), ("variants", 0, "quant"), ("variants", 0, "layers"),
    ("devices",), ("devices", 0), ("prompts",), ("decode_tokens",), ("repetitions",), ("extra",),
]  # fmt: skip
SWEEP_TABLES = ("sweeps", "builds", "runs", "sweep_variants", "transitions")


@BOUNDED
@given(spec=mutated(SWEEP, SPEC_PATHS) | JSON)
def test_any_sweep_spec_is_accepted_or_refused_cleanly(api, user_token, spec) -> None:
    _send(api, "POST", "/api/v1/sweeps", spec, user_token, SWEEP_TABLES)


RECIPE_WORDS = st.sampled_from(
    ["fp16", "w8", "w4", "base", "top", "embed", "attn", "ffn", "lm_head", "int8", "int4", "lut",
     "=", ",", "/", " ", "0", "2", "4", "6", "8", "32", "4097", "-1", "\n", "\ud800", "é"]
)  # fmt: skip
RECIPES = st.lists(RECIPE_WORDS, max_size=10).map("".join) | st.text(max_size=30)


@BOUNDED
@given(recipe=RECIPES)
def test_any_quant_recipe_is_parsed_or_refused_by_name(api, user_token, recipe) -> None:
    try:
        parse_recipe(recipe)
    except RecipeError as error:
        assert str(error)  # the grammar says what is wrong
    spec = {**SWEEP, "variants": [{"attention": "folded", "quant": recipe}]}
    _send(api, "POST", "/api/v1/sweeps", spec, user_token, SWEEP_TABLES)


RESULT_PATHS = [
    ("device_udid",), ("device_class",), ("driver",), ("simulated",), ("load_time_cold_ms",),
    ("peak_memory_bytes",), ("prompts",), ("prompts", 0), ("prompts", 0, "prompt_index"),
    ("prompts", 0, "generated_tokens"), ("prompts", 0, "decode_tok_s"), ("prompts", 0, "ttft_ms"),
    ("prompts", 0, "token_latencies_ms"), ("prompts", 0, "token_latencies_ms", 0),
    ("prompts", 1, "prompt_index"), ("extra",),
]  # fmt: skip


@pytest.fixture
def running_run(api, user_token, worker_token, agent_token) -> int:
    from tests.support.sweeps import DEVICE, finish_builds

    sweep = api.post("/api/v1/sweeps", json=SWEEP, headers=bearer(user_token)).json()
    finish_builds(api, sweep, worker_token)
    api.post(
        "/api/v1/agents/register",
        json={"name": "host-1", "devices": [DEVICE]},
        headers=bearer(agent_token),
    )
    claim = api.post(
        "/api/v1/agents/claim", json={"device_udid": "SIM-0001"}, headers=bearer(agent_token)
    )
    return claim.json()["run"]["run_id"]


@BOUNDED
@given(result=mutated(result_for(range(3), 10.0), RESULT_PATHS))
def test_any_run_result_is_stored_or_refused_cleanly(api, agent_token, running_run, result) -> None:
    _send(
        api, "POST", f"/api/v1/runs/{running_run}/results", result, agent_token,
        ("prompt_results", "transitions"),
    )  # fmt: skip
