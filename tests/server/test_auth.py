from __future__ import annotations

from tests.support.api import bearer

SWEEP = {"model": "tiny-gqa", "variants": [{"attention": "folded"}], "devices": ["iphone-17-pro"]}


def test_no_token_is_401_with_a_bearer_challenge(api) -> None:
    response = api.post("/api/v1/sweeps", json=SWEEP)
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"] == "Bearer"
    assert "missing bearer token" in response.json()["detail"]


def test_unknown_token_is_401(api) -> None:
    response = api.get("/api/v1/sweeps", headers=bearer("not-a-real-token-at-all"))
    assert response.status_code == 401
    assert response.json()["detail"] == "unknown or revoked token"


def test_agent_token_cannot_submit_sweeps(api, agent_token: str) -> None:
    response = api.post("/api/v1/sweeps", json=SWEEP, headers=bearer(agent_token))
    assert response.status_code == 403
    assert "needs a user token" in response.json()["detail"]


def test_user_token_cannot_claim_runs(api, user_token: str) -> None:
    response = api.post(
        "/api/v1/agents/claim", json={"device_udid": "x"}, headers=bearer(user_token)
    )
    assert response.status_code == 403


def test_agent_endpoints_need_a_token(api) -> None:
    for path in ("/api/v1/agents/register", "/api/v1/agents/heartbeat", "/api/v1/agents/claim"):
        assert api.post(path, json={}).status_code == 401


def test_openapi_is_served(api) -> None:
    assert api.get("/docs").status_code == 200
    schema = api.get("/openapi.json").json()
    assert "/api/v1/sweeps" in schema["paths"]
