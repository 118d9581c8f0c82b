"""The web UI in headless Chromium: sign in, submit through the form and watch the sweep finish
without a reload, errors next to their field, charts, the build page and its diff picker, a
sweep no device can take explained and cancelled, the fleet after an agent leaves; every page
at phone width without sideways scroll, screenshotted, and scanned by axe-core.

The build worker and the agent are played over HTTP by the test (their wire protocol, against
the real server process): the browser is what is under test here."""

from __future__ import annotations

import pytest

from scripts.stack import Stack
from tests.support.api import bearer, complete_build
from tests.support.browser import FIGURES, SCREENS, check_pages, register_device, sign_in

pytestmark = pytest.mark.browser


def run_everything_queued(roles, stack: Stack, prompts: int) -> None:
    agent = bearer(stack.tokens["agent"])
    for rate in (40.0, 90.0):
        claim = roles.post("/api/v1/agents/claim", json={"device_udid": "SIM-0017"}, headers=agent)
        run = claim.json()["run"]
        result = {
            "device_udid": "SIM-0017", "device_class": "iphone-17-pro",
            "product_type": "iPhone18,1", "driver": "simulated", "simulated": True,
            "load_time_cold_ms": 10.0, "load_time_warm_ms": 5.0, "peak_memory_bytes": 1 << 20,
            "timing_model": "test",
            "prompts": [
                {"prompt_index": index, "prompt_tokens": 5, "generated_tokens": 2,
                 "ttft_ms": 3.0, "prefill_tok_s": 100.0, "decode_tok_s": rate + index,
                 "token_latencies_ms": [1.0, 1.0]}
                for index in range(prompts)
            ],
        }  # fmt: skip
        stored = roles.post(f"/api/v1/runs/{run['run_id']}/results", json=result, headers=agent)
        assert stored.json()["state"] == "succeeded", stored.text


def test_submit_through_the_form_and_watch_it_finish_without_a_reload(
    stack: Stack, page, roles
) -> None:
    register_device(roles, stack)
    page.goto(f"{stack.server_url}/sweeps/new")
    assert page.url.endswith("/login?next=/sweeps/new")  # pages need a signed-in user
    page.fill("input[name=token]", stack.tokens["user"])
    page.click("button[type=submit]")
    page.wait_for_url("**/sweeps/new")  # back to the deep link
    assert page.inner_text('[data-device-class="iphone-17-pro"]') == "(1 ready)"
    assert page.is_checked("input[value=iphone-17-pro]")  # the only class with a device
    assert not page.is_checked("input[value=iphone-15-pro]")
    page.fill("#prompts", "3")
    page.fill("#decode_tokens", "2")
    page.click("#sweep-form button[type=submit]")
    page.wait_for_url("**/sweeps/1")
    assert page.inner_text("h1") == "Sweep 1 · tiny-gqa"
    assert page.get_attribute("#sweep-state", "data-state") == "building"
    page.evaluate("window.__not_reloaded = true")

    sweep = roles.get("/api/v1/sweeps/1", headers=bearer(stack.tokens["user"])).json()
    for build in sweep["builds"]:
        complete_build(roles, build, stack.tokens["worker"], FIGURES)
    run_everything_queued(roles, stack, prompts=3)

    page.wait_for_selector('#sweep-state[data-state="completed"]', timeout=20_000)
    assert page.evaluate("window.__not_reloaded") is True
    bars = page.locator("#tok-s-chart rect.bar")
    assert bars.count() == 2  # one per variant × device
    keys = {bars.nth(i).get_attribute("data-key") for i in range(2)}
    assert keys == {"repeat_kv-ctx512-fp16|iphone-17-pro", "folded-ctx512-fp16|iphone-17-pro"}
    assert page.locator("#tok-s-chart path.whisker").count() == 2
    assert page.locator("#per-prompt-chart circle.point").count() == 3
    assert page.locator("#comparison tbody tr").count() == 2


def test_a_validation_error_is_shown_next_to_its_field(stack: Stack, page) -> None:
    sign_in(stack, page, "/sweeps/new")
    page.fill("#variant1_layers", "99")
    page.check("input[value=iphone-17-pro]")
    page.check("input[name=confirm_unattached]")
    page.click("#sweep-form button[type=submit]")
    message = page.locator("#error-variant1_layers")
    assert (
        message.inner_text() == "Row 2's layers (99) is more than the 2 decoder layers tiny-gqa has"
    )
    assert page.get_attribute("#variant1_layers", "aria-invalid") == "true"
    assert page.get_attribute("#variant1_layers", "aria-describedby") == "error-variant1_layers"
    assert page.input_value("#variant1_layers") == "99"  # the form keeps the input
    box, field = message.bounding_box(), page.locator("#variant1_layers").bounding_box()
    assert abs(box["x"] - field["x"]) < 40 and 0 <= box["y"] - field["y"] < 60  # beside it


def test_pages_explain_cancel_diff_and_pass_at_phone_width(stack: Stack, browser, roles) -> None:
    from axe_playwright_python.sync_playwright import Axe

    user = bearer(stack.tokens["user"])
    register_device(roles, stack)
    spec = {
        "model": "tiny-gqa", "devices": ["iphone-15-pro"], "prompts": 2,
        "variants": [{"attention": "repeat_kv", "context": 128}, {"attention": "folded", "context": 128}],
    }  # fmt: skip
    sweep = roles.post("/api/v1/sweeps", json=spec, headers=user).json()
    repeat, folded = sweep["builds"]
    complete_build(roles, repeat, stack.tokens["worker"], FIGURES)
    complete_build(roles, folded, stack.tokens["worker"], {"op_counts": {"matmul": 4}})

    page = browser.new_page()
    sign_in(stack, page, f"/sweeps/{sweep['id']}")
    explanation = page.inner_text("#unschedulable")
    assert "no iPhone 15 Pro attached; never seen by any agent" in explanation

    page.click(f"a[href='/builds/{repeat['id']}']")
    page.wait_for_url(f"**/builds/{repeat['id']}")
    rows = page.locator("#redundant-ops tbody tr")
    assert rows.count() == 1 and "1×4×128×16" in rows.inner_text()
    page.select_option("#diff-other", str(folded["id"]))
    page.click("#diff-picker button[type=submit]")
    page.wait_for_url(f"**/builds/{repeat['id']}/diff/{folded['id']}")

    page.goto(f"{stack.server_url}/sweeps/{sweep['id']}")
    page.click("#cancel-sweep")
    page.wait_for_selector('#sweep-state[data-state="failed"]')
    assert "cancelled by" in page.inner_text("#runs")
    assert page.locator("#cancel-sweep").count() == 0

    agent = bearer(stack.tokens["agent"])
    roles.post("/api/v1/agents/heartbeat", json={"devices": []}, headers=agent)
    page.goto(f"{stack.server_url}/devices")
    assert page.locator('#gone tr[data-udid="SIM-0017"]').count() == 1

    pages = {
        "sweeps": "/",
        "new-sweep": "/sweeps/new",
        "sweep": f"/sweeps/{sweep['id']}",
        "build": f"/builds/{repeat['id']}",
        "diff": f"/builds/{repeat['id']}/diff/{folded['id']}",
        "fleet": "/devices",
        "profiles": "/profiles",
        "not-found": "/sweeps/999",
    }
    problems = check_pages(stack, page, pages)
    page.context.clear_cookies()
    page.goto(f"{stack.server_url}/login")
    page.screenshot(path=str(SCREENS / "login.png"), full_page=True)
    login_violations = Axe().run(page).response["violations"]
    assert not [v for v in login_violations if v["impact"] in ("serious", "critical")]
    assert problems == {}
