"""The nightly pages' edges without a browser: empty, missing and malformed schedules, and the
pause form's CSRF, scope and redirect checks."""

from __future__ import annotations

from tests.support.api import bearer, make_token
from tests.support.pages import page_csrf, ui_sign_in
from tests.support.schedules import NIGHTLY_SPEC


def test_pages_answer_empty_missing_and_bad_ids_in_the_sites_frame(api, user_token) -> None:
    ui_sign_in(api, user_token)
    assert 'id="no-schedules"' in api.get("/schedules").text
    missing = api.get("/schedules/9")
    assert missing.status_code == 404 and "no schedule 9" in missing.text
    for bad in ("0", "abc", str(2**31)):
        page = api.get(f"/schedules/{bad}")
        assert page.status_code == 422 and "<html" in page.text, bad
    body = {"name": "fresh", "spec": NIGHTLY_SPEC, "cron": "0 2 * * *"}
    api.post("/api/v1/schedules", json=body, headers=bearer(user_token))
    fresh = api.get("/schedules/1").text
    assert "No finished night yet." in fresh and "Not fired yet." in fresh
    assert 'id="no-alerts"' in fresh
    assert "never fired" in api.get("/schedules").text


def test_pause_needs_the_csrf_token_and_the_submit_scope_and_stays_on_site(api, user_token) -> None:
    body = {"name": "gated", "spec": NIGHTLY_SPEC, "cron": "0 2 * * *"}
    api.post("/api/v1/schedules", json=body, headers=bearer(user_token))
    ui_sign_in(api, user_token)
    csrf = page_csrf(api.get("/schedules").text)
    assert api.post("/schedules/1/pause", data={"csrf_token": "stale"}).status_code == 403
    assert api.post("/schedules/9/pause", data={"csrf_token": csrf}).status_code == 404
    paused = api.post(
        "/schedules/1/pause", data={"csrf_token": csrf, "next": "//evil.example/"},
        follow_redirects=False,
    )  # fmt: skip
    assert paused.status_code == 303 and paused.headers["location"] == "/schedules"
    schedule = api.get("/api/v1/schedules/1", headers=bearer(user_token)).json()
    assert schedule["enabled"] is False and schedule["next_due_at"] is None
    back = api.post("/schedules/1/resume", data={"csrf_token": csrf, "next": "/schedules/1"})
    assert back.url.path == "/schedules/1" and 'data-state="active"' in back.text

    api.cookies.clear()
    reader = make_token("user", "reader", ("read",))
    ui_sign_in(api, reader)
    csrf = page_csrf(api.get("/schedules").text)
    refused = api.post("/schedules/1/pause", data={"csrf_token": csrf})
    assert refused.status_code == 403 and "submit scope" in refused.text
    assert api.get("/api/v1/schedules/1", headers=bearer(user_token)).json()["enabled"] is True
