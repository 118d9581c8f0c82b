"""Signing in to the pages with a test client, as a browser's form would."""

from __future__ import annotations

import re


def page_csrf(html: str) -> str:
    """The CSRF token a page's form carries."""
    match = re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert match, "the form carries a CSRF token"
    return match.group(1)


def ui_sign_in(api, token: str, next_path: str = "/"):
    """Sign in to the pages as a browser would: fetch the form, post it with its CSRF token."""
    form = api.get("/login", params={"next": next_path})
    return api.post(
        "/login",
        data={"token": token, "csrf_token": page_csrf(form.text), "next": next_path},
        follow_redirects=False,
    )
