"""Headless Chromium on the server process: launching it, signing in, and checking every page
at two widths (screenshots, sideways scroll, axe-core)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from scripts.stack import Stack
from tests.support.api import bearer

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENS = Path(__file__).resolve().parents[2] / "test-results" / "screens"  # in the checkout
DEVICE = {
    "udid": "SIM-0017", "device_class": "iphone-17-pro", "product_type": "iPhone18,1",
    "os_version": "26.1", "driver": "simulated", "simulated": True,
}  # fmt: skip
COPY = {
    "kind": "tile", "op": "tile", "name": "k_rep_0", "function": "main", "shape": [1, 4, 128, 16],
    "dtype": "fp16", "bytes": 16384, "moved_bytes": 32768, "source_op": "read_state",
    "source": "key_cache_0",
}  # fmt: skip
FIGURES = {
    "redundant_ops": [COPY], "op_counts": {"tile": 1, "matmul": 4}, "ops_total": 5,
    "bytes_per_token": {"weights": 3 << 20, "kv_read": 1 << 20, "redundant": 1 << 19},
}  # fmt: skip


# The outermost elements sticking out of the viewport: what to fix when a page scrolls sideways.
WIDEST = """() => [...document.querySelectorAll('body *')]
  .filter(e => e.getBoundingClientRect().right > window.innerWidth + 1)
  .filter(e => !(e.parentElement && e.parentElement.getBoundingClientRect().right > window.innerWidth + 1))
  .slice(0, 5).map(e => e.tagName + '#' + e.id + '.' + e.className)"""


@contextmanager
def launched_browser() -> Iterator:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            launched.close()


def sign_in(stack: Stack, page, path: str = "/") -> None:
    page.goto(f"{stack.server_url}{path}")
    page.fill("input[name=token]", stack.tokens["user"])
    page.click("button[type=submit]")
    page.wait_for_url(f"**{path}")


def register_device(roles, stack: Stack) -> None:
    body = {"name": "host-1", "devices": [DEVICE]}
    agent = bearer(stack.tokens["agent"])
    assert roles.post("/api/v1/agents/register", json=body, headers=agent).is_success


def check_pages(stack: Stack, page, pages: dict[str, str]) -> dict[str, list[str]]:
    """Each page at 1280 and 390 px: screenshotted, no sideways scroll at 390 px (asserted), and
    axe-core's serious or critical violations returned by page name."""
    from axe_playwright_python.sync_playwright import Axe

    SCREENS.mkdir(parents=True, exist_ok=True)
    axe = Axe()
    problems = {}
    for width, suffix in ((1280, ""), (390, "-390")):
        page.set_viewport_size({"width": width, "height": 844})
        for name, path in pages.items():
            page.goto(f"{stack.server_url}{path}")
            if width == 390:
                scroll = page.evaluate("document.documentElement.scrollWidth")
                wide = page.evaluate(WIDEST)
                assert scroll <= 390, f"{name} scrolls sideways at 390 px ({scroll} px): {wide}"
            page.screenshot(path=str(SCREENS / f"{name}{suffix}.png"), full_page=True)
            violations = axe.run(page).response["violations"]
            serious = [v["id"] for v in violations if v["impact"] in ("serious", "critical")]
            if serious:
                problems[f"{name}{suffix}"] = serious
    return problems
