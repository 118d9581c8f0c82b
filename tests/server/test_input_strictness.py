"""Hostile input gets a 422 naming the field, never a 500, and writes nothing."""

from __future__ import annotations

import json

import pytest

from tests.support.api import bearer
from tests.support.services import table_counts
from tests.support.sweeps import SWEEP, result_for

SWEEP_JSON = json.dumps(SWEEP)


def _post_raw(api, path: str, body: str, token: str):
    headers = {**bearer(token), "Content-Type": "application/json"}
    return api.post(path, content=body.encode("utf-8", "surrogatepass"), headers=headers)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (SWEEP_JSON.replace('"prompts": 3', '"prompts": NaN'), "prompts"),
        (SWEEP_JSON.replace('"prompts": 3', '"prompts": Infinity'), "prompts"),
        (SWEEP_JSON.replace('"prompts": 3', '"prompts": "3"'), "prompts"),
        (SWEEP_JSON.replace('"prompts": 3', '"prompts": true'), "prompts"),
        (SWEEP_JSON.replace('"decode_tokens": 4', '"decode_tokens": 1e999'), "decode_tokens"),
        (SWEEP_JSON.replace('"repeat_kv"}', '"repeat_kv", "context": "512"}'), "context"),
        (SWEEP_JSON.replace('"repeat_kv"}', '"repeat_kv", "name": "abc\\n"}'), "name"),
        (SWEEP_JSON.replace('"tiny-gqa"', '"tiny-\\ud800"'), "body"),
    ],
    ids=["nan", "infinity", "string", "bool", "1e999", "string-context", "newline", "surrogate"],
)
def test_bad_numbers_and_text_are_422_naming_the_field(api, user_token, body, field) -> None:
    response = _post_raw(api, "/api/v1/sweeps", body, user_token)
    assert response.status_code == 422, response.text
    assert field in json.dumps(response.json()["detail"])
    assert table_counts()["sweeps"] == 0 and table_counts()["builds"] == 0


def test_decode_tokens_must_leave_room_for_a_prompt(api, user_token) -> None:
    spec = {**SWEEP, "variants": [{"attention": "folded", "context": 64}], "decode_tokens": 64}
    response = api.post("/api/v1/sweeps", json=spec, headers=bearer(user_token))
    assert response.status_code == 422
    assert "leaves no room for a prompt in variants.0.context (64)" in response.text
    assert table_counts()["sweeps"] == 0


@pytest.mark.parametrize(
    ("path", "where"),
    [
        ("/api/v1/sweeps/2147483648", "path"),
        ("/api/v1/builds/0", "path"),
        ("/api/v1/builds/-1", "path"),
        ("/api/v1/alerts?schedule_id=2147483648", "query"),
        ("/api/v1/sweeps/1/verdicts?baseline_sweep=2147483648", "query"),
    ],
)
def test_ids_outside_their_column_are_422(api, user_token, path, where) -> None:
    response = api.get(path, headers=bearer(user_token))
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["loc"][0] == where


def test_bad_result_figures_are_refused(api, ready_sweep, agent_token) -> None:
    agent = bearer(agent_token)
    claim = api.post("/api/v1/agents/claim", json={"device_udid": "SIM-0001"}, headers=agent)
    run_id = claim.json()["run"]["run_id"]
    path = f"/api/v1/runs/{run_id}/results"
    good = result_for(range(3), 10.0)

    negative = json.loads(json.dumps(good))
    negative["prompts"][0]["token_latencies_ms"] = [-1.0, 1.0]
    assert api.post(path, json=negative, headers=agent).status_code == 422
    huge = json.dumps(good).replace('"decode_tok_s": 10.0', '"decode_tok_s": 1e308')
    assert _post_raw(api, path, huge, agent_token).status_code == 422
    nan = json.dumps(good).replace('"decode_tok_s": 10.0', '"decode_tok_s": NaN')
    assert _post_raw(api, path, nan, agent_token).status_code == 422
    too_many = json.loads(json.dumps(good))
    too_many["prompts"][0]["generated_tokens"] = 5
    too_many["prompts"][0]["token_latencies_ms"] = [1.0] * 5
    refused = api.post(path, json=too_many, headers=agent)
    assert refused.status_code == 422
    assert "generated_tokens 5 exceeds the sweep's decode_tokens 4" in refused.text
    assert table_counts()["prompt_results"] == 0


def test_results_of_an_ended_run_are_immutable(api, ready_sweep, agent_token, user_token) -> None:
    agent = bearer(agent_token)
    claim = api.post("/api/v1/agents/claim", json={"device_udid": "SIM-0001"}, headers=agent)
    run_id = claim.json()["run"]["run_id"]
    path = f"/api/v1/runs/{run_id}/results"
    result = result_for(range(3), 10.0)
    assert api.post(path, json=result, headers=agent).json()["state"] == "succeeded"
    # the same upload again (a response lost on the wire): answered as stored
    again = api.post(path, json=result, headers=agent)
    assert again.status_code == 200 and again.json()["state"] == "succeeded"
    rewritten = result_for(range(1), 99_999.0)
    refused = api.post(path, json=rewritten, headers=agent)
    assert refused.status_code == 409 and "immutable" in refused.text
    sweep = api.get(f"/api/v1/sweeps/{ready_sweep['id']}", headers=bearer(user_token)).json()
    stored = next(run for run in sweep["runs"] if run["id"] == run_id)
    assert stored["summary"]["decode_tok_s"]["mean"] == pytest.approx(11.0)
