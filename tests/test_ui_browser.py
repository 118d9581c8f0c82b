"""The web UI in headless Chromium: sign in, submit a sweep through the form, see its page."""

from __future__ import annotations

import pytest
from stack import Stack

from decodebench.profiles import DEVICE_PROFILES

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture
def page():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser.new_page()
        finally:
            browser.close()


def test_submit_a_sweep_through_the_form(stack: Stack, page) -> None:
    page.goto(f"{stack.server_url}/sweeps/new")
    assert page.url.endswith("/login?next=/sweeps/new")  # pages need a signed-in user
    page.fill("input[name=token]", stack.tokens["user"])
    page.click("button[type=submit]")
    page.wait_for_url("**/sweeps/new")  # back to the deep link

    page.select_option("select[name=model]", "tiny-gqa")
    page.select_option("select[name=variant0_attention]", "repeat_kv")
    page.select_option("select[name=variant1_attention]", "folded")
    page.fill("input[name=prompts]", "5")
    page.click("#sweep-form button[type=submit]")

    page.wait_for_url("**/sweeps/1")
    assert page.inner_text("h1") == "Sweep 1 · tiny-gqa"
    assert page.inner_text("#sweep-state") == "building"
    rows = page.locator("#comparison tbody tr")
    # every iPhone class is ticked by default; the host CPU class is opt-in
    devices = sum(profile.kind == "iphone" for profile in DEVICE_PROFILES.values())
    assert rows.count() == 2 * devices
    assert "repeat_kv-ctx512-fp16" in rows.nth(0).inner_text()
    assert page.locator("#runs tbody tr").count() == 2 * devices


def test_form_errors_name_the_field(stack: Stack, page) -> None:
    page.goto(f"{stack.server_url}/login")
    page.fill("input[name=token]", stack.tokens["user"])
    page.click("button[type=submit]")
    page.goto(f"{stack.server_url}/sweeps/new")
    page.fill("input[name=variant0_context]", "7")
    page.fill("input[name=variant1_quant]", "ffn=int3")
    page.click("#sweep-form button[type=submit]")
    alert = page.inner_text("[role=alert]")
    assert "variants.0.context" in alert
    assert "greater than or equal to 64" in alert
    assert "variants.1.quant" in alert
    assert page.input_value("input[name=variant1_quant]") == "ffn=int3"  # the form keeps the input
    page.goto(stack.server_url)
    assert "No sweeps yet." in page.inner_text("main")


def test_wrong_token_is_refused(stack: Stack, page) -> None:
    page.goto(f"{stack.server_url}/login")
    page.fill("input[name=token]", "not-a-token-of-ours")
    page.click("button[type=submit]")
    assert page.inner_text("[role=alert]") == "Unknown user token."
