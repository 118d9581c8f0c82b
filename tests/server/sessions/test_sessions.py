"""The pages' session: a server-side id in a hardened cookie, CSRF tokens, an Origin check,
security headers, rate-limited sign-in, the deep link kept, HTML error pages, offline docs."""

from __future__ import annotations

from tests.support.api import bearer
from tests.support.pages import page_csrf, ui_sign_in


def test_the_cookie_holds_a_session_id_not_the_token_and_returns_to_the_deep_link(
    api, user_token
) -> None:
    away = api.get("/sweeps/new?x=1", follow_redirects=False)
    assert away.status_code == 303
    assert away.headers["location"] == "/login?next=/sweeps/new%3Fx%3D1"
    response = ui_sign_in(api, user_token, "/sweeps/new?x=1")
    assert response.status_code == 303
    assert response.headers["location"] == "/sweeps/new?x=1"
    cookie = response.headers["set-cookie"]
    assert cookie.startswith("decodebench_session=")
    assert user_token not in cookie
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Max-Age=43200" in cookie
    assert "Secure" not in cookie  # the test environment is served over plain http
    assert api.get("/sweeps/new").status_code == 200


def test_a_deep_link_to_another_site_is_not_followed(api, user_token) -> None:
    for hostile in ("//evil.example/x", "https://evil.example", "/\\evil.example"):
        assert ui_sign_in(api, user_token, hostile).headers["location"] == "/"


def test_sign_out_revokes_the_session_on_the_server(api, user_token) -> None:
    ui_sign_in(api, user_token)
    stolen = dict(api.cookies)
    page = api.get("/")
    assert api.post("/logout", data={"csrf_token": page_csrf(page.text)}).url.path == "/login"
    api.cookies.clear()
    replay = api.get("/", cookies=stolen, follow_redirects=False)
    assert replay.status_code == 303 and replay.headers["location"] == "/login"


def test_forms_need_the_session_csrf_token_and_a_same_origin_post(api, user_token) -> None:
    ui_sign_in(api, user_token)
    token = page_csrf(api.get("/sweeps/new").text)
    missing = api.post("/sweeps/new", data={"model": "tiny-gqa"})
    assert missing.status_code == 403 and "CSRF" in missing.text
    assert "<html" in missing.text  # an error page in the site's frame
    cross = api.post(
        "/sweeps/new",
        data={"model": "tiny-gqa", "csrf_token": token},
        headers={"Origin": "https://evil.example"},
    )
    assert cross.status_code == 403 and "cross-origin" in cross.text
    assert api.get("/").text.count("No sweeps yet.") == 1  # nothing was submitted


def test_the_sign_in_form_has_its_own_csrf_token(api, user_token) -> None:
    api.get("/login")
    refused = api.post("/login", data={"token": user_token, "csrf_token": "forged"})
    assert refused.status_code == 403
    assert "decodebench_session" not in api.cookies


def test_sign_in_is_rate_limited_per_client(api, user_token) -> None:
    form = api.get("/login")
    csrf = page_csrf(form.text)
    for _ in range(10):
        wrong = api.post("/login", data={"token": "not-a-token-of-ours", "csrf_token": csrf})
        assert wrong.status_code == 401
    limited = api.post("/login", data={"token": user_token, "csrf_token": csrf})
    assert limited.status_code == 429
    assert 1 <= int(limited.headers["Retry-After"]) <= 300
    assert "decodebench_session" not in api.cookies  # even the right token waits


def test_every_response_carries_the_security_headers(api, user_token) -> None:
    for response in (api.get("/login"), api.get("/api/v1/health"), api.get("/static/style.css")):
        headers = response.headers
        assert "frame-ancestors 'none'" in headers["Content-Security-Policy"]
        assert "script-src 'self';" in headers["Content-Security-Policy"]
        assert headers["X-Content-Type-Options"] == "nosniff"
        assert headers["Referrer-Policy"] == "same-origin"
    assert "<script>" not in api.get("/login").text


def test_page_errors_are_html_and_api_errors_stay_json(api, user_token) -> None:
    ui_sign_in(api, user_token)
    missing = api.get("/sweeps/999")
    assert missing.status_code == 404 and missing.headers["content-type"].startswith("text/html")
    assert "sweep 999" in missing.text.lower()
    assert api.get("/no/such/page").status_code == 404
    invalid = api.get("/sweeps/2147483648")
    assert invalid.status_code == 422 and "<html" in invalid.text
    api_missing = api.get("/api/v1/sweeps/999", headers=bearer(user_token))
    assert api_missing.status_code == 404 and "detail" in api_missing.json()


def test_docs_are_served_offline(api) -> None:
    page = api.get("/docs")
    assert page.status_code == 200 and "/docs/assets/swagger-ui-bundle.js" in page.text
    assert "cdn" not in page.text.lower()
    bundle = api.get("/docs/assets/swagger-ui-bundle.js")
    assert bundle.status_code == 200 and len(bundle.content) > 100_000
    assert api.get("/static/favicon.svg").status_code == 200
