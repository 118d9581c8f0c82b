"""The nightly pages in headless Chromium: a schedule whose folded variant slows down by 8% after
a new coremltools, confirmed by its re-run; the list with pause and resume, the trend charts with
their band and the regression's marker linking to the alert and the build diff; at phone width,
screenshotted and scanned by axe-core like every other page.

Nights are fired by the tick endpoint with a settable clock (as
tests/server/schedules/test_schedules.py does) and the test plays the build worker and the agent
over HTTP, so nothing waits for a real night."""

from __future__ import annotations

import random
from datetime import datetime, timedelta

import pytest

from scripts.stack import Stack
from tests.support.api import bearer, complete_build
from tests.support.browser import DEVICE, FIGURES, check_pages, register_device, sign_in
from tests.support.schedules import FIRST_NIGHT

pytestmark = pytest.mark.browser

SPEC = {
    "model": "tiny-gqa",
    "variants": [{"attention": "repeat_kv"}, {"attention": "folded"}],
    "devices": ["iphone-17-pro"],
    "prompts": 4,
    "decode_tokens": 4,
    "repetitions": 1,
}
FOLDED, REPEAT = "folded-ctx512-fp16", "repeat_kv-ctx512-fp16"


def measure_everything(
    client, stack: Stack, folded_speed: float, noise: random.Random, build: bool
) -> None:
    """Complete the builds the newest sweep waits for (``build``), then run every claimable run:
    repeat_kv at 1000 tok/s, folded at ``folded_speed`` times that, 1% noise per prompt."""
    user, agent = bearer(stack.tokens["user"]), bearer(stack.tokens["agent"])
    for sweep in client.get("/api/v1/sweeps", headers=user).json()[:1] if build else []:
        detail = client.get(f"/api/v1/sweeps/{sweep['id']}", headers=user).json()
        for build in detail["builds"]:
            if build["state"] == "queued":
                complete_build(client, build, stack.tokens["worker"], FIGURES)
    while run := client.post(
        "/api/v1/agents/claim", json={"device_udid": DEVICE["udid"]}, headers=agent
    ).json()["run"]:
        speed = folded_speed if run["variant"]["attention"] == "folded" else 1.0
        rates = [1000 * speed * noise.gauss(1.0, 0.01) for _ in range(run["prompts"])]
        result = {
            **{key: DEVICE[key] for key in ("device_class", "product_type", "driver", "simulated")},
            "device_udid": DEVICE["udid"], "load_time_cold_ms": 1.0, "load_time_warm_ms": 1.0,
            "peak_memory_bytes": 1000, "timing_model": "stand-in",
            "prompts": [
                {"prompt_index": index, "prompt_tokens": 5, "generated_tokens": 4, "ttft_ms": 5.0,
                 "prefill_tok_s": 100.0, "decode_tok_s": rate, "token_latencies_ms": [1000 / rate] * 4,
                 "token_ids": [1, 2, 3, index]}
                for index, rate in enumerate(rates)
            ],
        }  # fmt: skip
        stored = client.post(f"/api/v1/runs/{run['run_id']}/results", json=result, headers=agent)
        assert stored.status_code == 200, stored.text


@pytest.fixture
def upgraded(stack: Stack, monkeypatch):
    """A second server on the same database, in this process, whose toolchain has coremltools
    9.1 (the browser's server process keeps 9.0): the night after an upgrade, without the
    seconds a restart of the server process costs."""
    from fastapi.testclient import TestClient

    from server.app import app
    from server.config import get_settings

    monkeypatch.setenv("DECODEBENCH_TOOLCHAIN_COREMLTOOLS", "9.1")
    get_settings.cache_clear()
    try:
        with TestClient(app) as client:
            yield client
    finally:
        monkeypatch.undo()
        get_settings.cache_clear()


def tick(client, stack: Stack, now: datetime) -> dict:
    body = {"now": now.isoformat()}
    ticked = client.post(
        "/api/v1/schedules/tick", json=body, headers=bearer(stack.tokens["worker"])
    )
    assert ticked.status_code == 200, ticked.text
    return ticked.json()


def nine_nights_and_a_confirmed_slowdown(client, upgraded, stack: Stack) -> dict:
    """Eight steady nights, then coremltools 9.1 and folded 8% slower: suspected, re-run on
    the same builds, confirmed. Returns the confirmed alert."""
    user = bearer(stack.tokens["user"])
    body = {"name": "nightly-gqa", "spec": SPEC, "cron": "0 2 * * *", "min_effect": 0.03}
    assert client.post("/api/v1/schedules", json=body, headers=user).status_code == 201
    register_device(client, stack)
    noise = random.Random(14)
    for night in range(9):
        server = upgraded if night == 8 else client
        now = FIRST_NIGHT + timedelta(days=night)
        assert len(tick(server, stack, now)["fired"]) == 1
        measure_everything(server, stack, 0.92 if night == 8 else 1.0, noise, build=night in (0, 8))
        tick(server, stack, now + timedelta(minutes=5))
    measure_everything(upgraded, stack, 0.92, noise, build=False)  # the confirmation re-run
    tick(upgraded, stack, FIRST_NIGHT + timedelta(days=8, minutes=10))
    alerts = client.get("/api/v1/alerts", headers=user).json()
    assert [(a["variant"], a["status"], a["direction"]) for a in alerts] == [
        (FOLDED, "confirmed", "regression")
    ]
    return alerts[0]


def test_nightly_pages_chart_the_trend_mark_the_regression_and_pause(
    stack: Stack, browser, roles, upgraded
) -> None:
    alert = nine_nights_and_a_confirmed_slowdown(roles, upgraded, stack)
    diff = alert["build_diff"].removeprefix("/api/v1")
    page = browser.new_page()
    sign_in(stack, page, "/schedules")
    row = page.locator('#schedules tr[data-schedule="1"]')
    assert "0 2 * * *" in row.inner_text() and "1 confirmed" in row.inner_text()
    assert row.locator("[data-state]").get_attribute("data-state") == "active"
    assert "2027-01-09" in row.inner_text()  # the last firing

    page.click("nav a[href='/schedules']")  # linked from every page's navigation
    page.click("#schedules a[href='/schedules/1']")
    page.wait_for_url("**/schedules/1")
    assert page.locator("figure.trend-chart").count() == 2  # one per variant × device class
    folded = page.locator(f"#series-{FOLDED}-iphone-17-pro")
    assert folded.locator("circle.night").count() == 9
    assert folded.locator("polygon.band").count() == 1
    marker = folded.locator("a.marker-regression")
    assert marker.get_attribute("href") == f"#alert-{alert['id']}"
    assert folded.locator("a.marker-diff").get_attribute("href") == diff
    steady = page.locator(f"#series-{REPEAT}-iphone-17-pro")
    assert steady.locator("a.marker").count() == 0
    assert folded.locator("table.nights tbody tr").count() == 9  # the chart's figures
    listed = page.locator(f"#alert-{alert['id']}")
    assert "confirmed" in listed.inner_text() and "coremltools" in listed.inner_text()
    assert "0.9" in listed.inner_text() and "slower" in listed.inner_text()

    folded.locator("a.marker-diff").click()
    page.wait_for_url(f"**{diff}")
    page.go_back()
    page.click("button.toggle-schedule")
    page.wait_for_url("**/schedules/1")
    assert page.get_attribute("#schedule-state", "data-state") == "paused"
    assert "— (paused)" in page.inner_text("ul.facts")
    page.goto(f"{stack.server_url}/schedules")
    page.click("button.toggle-schedule")
    page.wait_for_url("**/schedules")
    assert page.get_attribute("#schedules [data-state]", "data-state") == "active"

    pages = {"schedules": "/schedules", "schedule": "/schedules/1", "schedule-404": "/schedules/9"}
    assert check_pages(stack, page, pages) == {}
