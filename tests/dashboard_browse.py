# Drives headless Chromium through the dashboard for tests/test_dashboard_browser.py, in a
# process of its own: Playwright needs a plain asyncio, which trio-asyncio changes process-wide.
# Usage: python -m tests.dashboard_browse URL JOBS_JSON CHROMIUM [SCREENSHOT_DIR]
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from playwright import sync_api

from tests.dashboard_site import HOSTILE_NAME, Seeded


def main(url: str, jobs_json: str, chromium: str, shots: str) -> None:
    jobs = Seeded(**json.loads(jobs_json))
    browse(url, jobs, chromium, Path(shots) if shots else None)


def browse(url: str, jobs: Seeded, chromium: str, shots: Path | None) -> None:
    def shot(page: Any, name: str) -> None:
        if shots is not None:
            page.screenshot(path=str(shots / f"dashboard-{name}.png"), full_page=True)

    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 700})
            dialogs: list[str] = []
            page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))

            page.goto(url + "/")
            assert page.locator("tr.queue").count() == 2
            shot(page, "queues")

            page.goto(url + "/jobs")
            assert page.locator("tr.job").count() == 4
            # The filter form, as a person uses it.
            page.select_option("select[name=state]", "dead")
            page.click("#filters button")
            page.wait_for_url("**/jobs?state=dead**")
            assert _texts(page, "tr.job td.name") == ["mail.broken"]
            page.goto(url + "/jobs")
            shot(page, "jobs")

            # The hostile name is text in the DOM: no element came from it, no script ran.
            names = _texts(page, "tr.job td.name")
            assert any(n.startswith('<script>alert("name")</script><img') for n in names)
            assert page.locator("main script, main img").count() == 0
            assert dialogs == []

            page.click(f"a[href='/jobs/{jobs.completed}']")
            assert _texts(page, "tr.step td:first-child") == ["render", "send"]
            shot(page, "job")

            page.goto(f"{url}/jobs/{jobs.hostile}")
            shown = page.inner_text("#job-name")
            assert shown.startswith(HOSTILE_NAME[:40]) and "\\x1b" in shown
            assert dialogs == []

            # Actions are off: no button, and a POST from the page's own origin is refused.
            assert page.locator("#retry, #cancel").count() == 0
            # (The page's CSP forbids fetch(); a form posted from the page is what a person,
            # or a page someone tricked them into, would send.)
            page.evaluate(
                """(action) => { const f = document.createElement('form');
                f.method = 'post'; f.action = action; document.body.append(f); f.submit(); }""",
                f"/jobs/{jobs.dead}/retry",
            )
            page.wait_for_selector("#error")
            assert "X_ACTIONS_OFF" in page.inner_text("#error")
            shot(page, "actions-off")
        finally:
            browser.close()


def _texts(page: Any, selector: str) -> list[str]:
    return [str(t) for t in page.locator(selector).all_inner_texts()]


if __name__ == "__main__":
    main(*sys.argv[1:5], *([""] if len(sys.argv) < 5 else []))
