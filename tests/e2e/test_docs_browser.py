"""/docs in a real browser: Debian's Chromium, driven by Playwright, loads Swagger UI from
a real Gunicorn, opens POST /predict, tries the example and reads the server's 200."""

from __future__ import annotations

from collections.abc import Callable

from playwright.sync_api import sync_playwright

from tests.deploy.tools import require
from tests.e2e.server import GunicornServer

# As the machine's browser probe starts Chromium: no sandbox as root, and nothing that
# reaches for the network beyond the page under test.
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip
WAIT_MS = 30_000


def test_docs_browser_tries_the_predict_example_and_reads_200(
    gunicorn: Callable[..., GunicornServer],
) -> None:
    chromium = require("chromium")
    server = gunicorn(workers=1)
    server.wait_ready(workers=1)

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            failed: list[str] = []
            page.on("requestfailed", lambda request: failed.append(request.url))
            page.goto(f"{server.url}/docs", timeout=WAIT_MS)
            operation = page.locator("#operations-service-post_predict")
            operation.locator(".opblock-summary").click(timeout=WAIT_MS)
            operation.get_by_role("button", name="Try it out").click(timeout=WAIT_MS)
            operation.get_by_role("button", name="Execute").click(timeout=WAIT_MS)
            live = operation.locator(".live-responses-table tr.response")
            status = live.locator(".response-col_status").first
            status.wait_for(timeout=WAIT_MS)
            code = status.inner_text().strip()
            body = live.locator(".microlight").first.inner_text()
        finally:
            browser.close()

    assert code == "200", body
    assert '"predictions"' in body
    assert failed == []  # every asset from the server itself, none from a CDN
