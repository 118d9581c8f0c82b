from __future__ import annotations

import pytest

from tests.support.api import bearer
from tests.support.services import table_counts

SWEEP = {
    "model": "tiny-gqa",
    "variants": [{"attention": "repeat_kv"}, {"attention": "folded"}],
    "devices": ["iphone-16-pro", "iphone-17-pro"],
    "prompts": 4,
    "decode_tokens": 8,
    "repetitions": 2,
}


@pytest.mark.parametrize(
    ("change", "field", "message"),
    [
        ({"model": "gpt-17"}, ["body", "model"], "unknown model preset 'gpt-17'"),
        (
            {"variants": [{"attention": "sideways"}]},
            ["body", "variants", 0, "attention"],
            "repeat_kv",
        ),
        (
            {"variants": [{"context": 10}]},
            ["body", "variants", 0, "context"],
            "greater than or equal",
        ),
        ({"variants": []}, ["body", "variants"], "at least 1"),
        ({"devices": ["pixel-9"]}, ["body", "devices"], "unknown device class 'pixel-9'"),
        ({"prompts": 31}, ["body", "prompts"], "less than or equal to 30"),
        ({"colour": "blue"}, ["body", "colour"], "Extra inputs"),
        (
            {"variants": [{"attention": "folded"}, {"attention": "folded"}]},
            ["body"],
            "distinct labels",
        ),
    ],
)
def test_bad_sweep_is_422_naming_the_field_and_writes_nothing(
    api, user_token: str, change: dict, field: list, message: str
) -> None:
    before = table_counts()
    response = api.post("/api/v1/sweeps", json={**SWEEP, **change}, headers=bearer(user_token))
    assert response.status_code == 422
    errors = response.json()["detail"]
    assert any(error["loc"] == field and message in error["msg"] for error in errors), errors
    assert table_counts() == before


def test_sweep_expands_into_shared_builds_and_interleaved_runs(api, user_token: str) -> None:
    response = api.post("/api/v1/sweeps", json=SWEEP, headers=bearer(user_token))
    assert response.status_code == 201, response.text
    sweep = response.json()
    assert sweep["state"] == "building"
    assert [build["state"] for build in sweep["builds"]] == ["queued", "queued"]
    assert len(sweep["runs"]) == 2 * 2 * 2  # variants x devices x repetitions
    for device_class in SWEEP["devices"]:
        order = [run["variant"] for run in sweep["runs"] if run["device_class"] == device_class]
        assert order == ["repeat_kv-ctx512-fp16", "folded-ctx512-fp16"] * 1 + [
            "folded-ctx512-fp16",
            "repeat_kv-ctx512-fp16",
        ]  # A B B A
    assert all(run["state"] == "waiting_build" for run in sweep["runs"])

    again = api.post("/api/v1/sweeps", json=SWEEP, headers=bearer(user_token)).json()
    assert [b["id"] for b in again["builds"]] == [b["id"] for b in sweep["builds"]]
    assert table_counts()["builds"] == 2


def test_a_different_context_is_a_different_build(api, user_token: str) -> None:
    spec = {
        **SWEEP,
        "variants": [
            {"attention": "folded", "context": 512},
            {"attention": "folded", "context": 1024},
        ],
    }
    sweep = api.post("/api/v1/sweeps", json=spec, headers=bearer(user_token)).json()
    assert len({build["key"] for build in sweep["builds"]}) == 2


def test_missing_sweep_is_404(api, user_token: str) -> None:
    response = api.get("/api/v1/sweeps/999", headers=bearer(user_token))
    assert response.status_code == 404
    assert response.json()["detail"] == "no sweep 999"


def test_sweeps_are_listed_newest_first(api, user_token: str) -> None:
    for _ in range(2):
        api.post("/api/v1/sweeps", json=SWEEP, headers=bearer(user_token))
    listed = api.get("/api/v1/sweeps", headers=bearer(user_token)).json()
    assert [sweep["id"] for sweep in listed] == [2, 1]
    assert listed[0]["submitted_by"] == "ci"
