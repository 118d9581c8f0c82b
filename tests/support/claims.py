"""Batched claims: many devices asking for a run in one request, with their claim keys."""

from __future__ import annotations

from tests.support.api import bearer


def claims(api, agent_token: str, pairs: list[tuple[str, str]], **extra):
    body = {"claims": [{"device_udid": u, "claim_key": k} for u, k in pairs], **extra}
    return api.post("/api/v1/agents/claims", json=body, headers=bearer(agent_token))


def given(response) -> dict[str, dict]:
    assert response.status_code == 200, response.text
    return {entry["device_udid"]: entry["run"] for entry in response.json()["runs"]}


def keyed(count: int, tag: str = "k") -> list[tuple[str, str]]:
    return [(f"SIM-{i:04d}", f"{tag}-key-{i:04d}") for i in range(count)]
