"""Tokens, and the build worker's side of the HTTP API, played by a test."""

from __future__ import annotations

import hashlib
import secrets

from scripts.standins import build_report, full_analysis


def make_token(kind: str, name: str, scopes: tuple[str, ...] = ()) -> str:
    from server.manage import create_token_command

    return create_token_command(kind, name, f"test-{kind}-{secrets.token_hex(12)}", scopes)


def project_token(project: str, name: str) -> str:
    """A user token of ``project`` (created on first use) with every scope."""
    from server.manage import create_token_command

    plain = f"test-{project}-{secrets.token_hex(12)}"
    return create_token_command("user", name, plain, ("read", "submit", "admin"), project)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def complete_build(api, build: dict, worker_token: str, analysis: dict) -> None:
    """Act as a build worker over HTTP: start, upload an artifact, report the analysis (its
    figures completed by :func:`full_analysis`)."""
    response = start_and_complete(
        api, build, worker_token, build_report(build, full_analysis(analysis))
    )
    assert response.status_code == 200, response.text


def start_and_complete(api, build: dict, worker_token: str, report: dict):
    """Start ``build``, upload an artifact and post ``report``; the completion's response."""
    headers = bearer(worker_token)
    started = api.post(
        f"/api/v1/builds/{build['id']}/start", json={"worker": "w1"}, headers=headers
    )
    assert started.json()["proceed"], started.text
    lease = started.json()["lease"]
    progress = {"lease": lease, "stage": "convert", "fraction": 0.5}
    assert (
        api.post(
            f"/api/v1/builds/{build['id']}/progress", json=progress, headers=headers
        ).status_code
        == 204
    )
    payload = build["key"].encode()
    sha256 = hashlib.sha256(payload).hexdigest()
    assert (
        api.put(f"/api/v1/artifacts/{sha256}", content=payload, headers=headers).status_code == 201
    )
    return api.post(
        f"/api/v1/builds/{build['id']}/complete",
        json={"lease": lease, "artifact_sha256": sha256, "report": report},
        headers=headers,
    )
