"""A build whose stored report no longer validates (only an edit of the database gets there):
every response that shows it names it as unreadable instead of answering 500, and a claim fails
its runs with that reason and hands out the next one."""

from __future__ import annotations

import json

from tests.support.api import bearer, complete_build
from tests.support.pages import ui_sign_in

SWEEP = {
    "model": "tiny-gqa",
    "variants": [{"attention": "repeat_kv", "context": 128}, {"attention": "folded", "context": 128}],
    "devices": ["iphone-17-pro"],
    "prompts": 2,
    "decode_tokens": 4,
}  # fmt: skip
FIGURES = {"bytes_per_token": {"weights": 3 << 20, "kv_read": 1 << 20, "total": 4 << 20}}
PHONE = {"udid": "SIM-1", "device_class": "iphone-17-pro", "product_type": "iPhone18,1",
         "driver": "simulated", "simulated": True}  # fmt: skip


def test_a_corrupt_stored_report_is_named_never_a_500(
    api, user_token, worker_token, agent_token
) -> None:
    from sqlalchemy import text

    from server.db import get_engine

    user = bearer(user_token)
    sweep = api.post("/api/v1/sweeps", json=SWEEP, headers=user).json()
    for build in sweep["builds"]:
        complete_build(api, build, worker_token, FIGURES)
    bad, good = (build["id"] for build in sweep["builds"])
    with get_engine().begin() as connection:  # what issue 10's attacker stored
        connection.execute(
            text("UPDATE builds SET report = CAST(:report AS jsonb) WHERE id = :id"),
            {"report": json.dumps({"analysis": {"hello": "world"}}), "id": bad},
        )
    named = f"build {bad}'s stored report is unreadable"

    detail = api.get(f"/api/v1/sweeps/{sweep['id']}", headers=user)
    assert detail.status_code == 200, detail.text
    shown = {build["id"]: build for build in detail.json()["builds"]}
    assert named in shown[bad]["error"] and shown[bad]["analysis"] is None
    assert shown[good]["error"] is None and shown[good]["analysis"] is not None
    build = api.get(f"/api/v1/builds/{bad}", headers=user)
    assert build.status_code == 200, build.text
    assert build.json()["report"] is None and named in build.json()["error"]
    diff = api.get(f"/api/v1/builds/{good}/diff/{bad}", headers=user)
    assert diff.status_code == 409 and named in diff.json()["detail"]

    ui_sign_in(api, user_token)
    for path in (f"/sweeps/{sweep['id']}", f"/builds/{bad}"):
        page = api.get(path)
        assert page.status_code == 200 and named in page.text.replace("&#39;", "'"), path

    # A claim fails the unreadable build's runs with the reason and hands out the good one.
    agent = bearer(agent_token)
    api.post("/api/v1/agents/register", json={"name": "lab", "devices": [PHONE]}, headers=agent)
    claimed = api.post("/api/v1/agents/claim", json={"device_udid": "SIM-1"}, headers=agent)
    assert claimed.status_code == 200, claimed.text
    assert claimed.json()["run"]["build_id"] == good
    runs = api.get(f"/api/v1/sweeps/{sweep['id']}", headers=user).json()["runs"]
    failed = [run for run in runs if run["state"] == "failed"]
    assert len(failed) == 1 and named in failed[0]["failure_reason"]
