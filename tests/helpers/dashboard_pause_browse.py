# Drives headless Chromium through the dashboard's actions for tests/ops/test_dashboard_pause.py,
# in a process of its own (Playwright needs a plain asyncio, which trio-asyncio changes
# process-wide). Usage: python -m tests.helpers.dashboard_pause_browse URL CHROMIUM [SHOTS_DIR]
# Talks with the test line by line: prints "PAUSED" once the overview's Pause button paused queue
# "mail", waits for "resume", resumes it from the overview while a second tab keeps the live job
# list open with a filter being typed, prints "RESUMED" once that list showed the jobs completed
# by itself, then runs the bulk actions and prints "BULK".
from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

from playwright import sync_api

# The pages update every second (the test serves them so): a change shows within a few.
LIVE_WITHIN_MS = 20_000


def main(url: str, chromium: str, shots: str) -> None:
    folder = Path(shots) if shots else None

    def shot(page: Any, name: str) -> None:
        if folder is not None:
            page.screenshot(path=str(folder / f"dashboard-{name}.png"), full_page=True)

    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            context = browser.new_context(viewport={"width": 1280, "height": 800})
            overview = context.new_page()
            asked: list[str] = []

            def accept(dialog: Any) -> None:
                asked.append(dialog.message)
                dialog.accept()

            overview.on("dialog", accept)
            pause(overview, url, asked)
            shot(overview, "paused")
            print("PAUSED", flush=True)
            assert sys.stdin.readline().strip() == "resume"
            resume(context, overview, url)
            print("RESUMED", flush=True)
            bulk(overview, url)
            shot(overview, "bulk")
            print("BULK", flush=True)
        finally:
            browser.close()


def pause(page: Any, url: str, asked: list[str]) -> None:
    """The overview's Pause button of queue "mail", as a person presses it (and confirms)."""
    page.goto(url + "/")
    name = page.locator("td:first-child a", has_text=re.compile(r"^mail$"))
    row = page.locator("tr.queue", has=name)
    row.locator("button.pause-queue").click()
    page.wait_for_url(url + "/")
    assert asked and asked[0].startswith("Pause queue mail on every worker?"), asked
    sync_api.expect(page.locator("#paused")).to_contain_text("mail")
    sync_api.expect(row.locator(".paused")).to_have_text("paused")


def resume(context: Any, overview: Any, url: str) -> None:
    """Resume from the overview while another tab holds the live job list, a filter half typed
    in it: that tab shows the jobs run, in place, the typed text untouched."""
    listing = context.new_page()
    listing.goto(url + "/jobs?queue=mail&name=pause.mail")
    assert listing.locator("#live").inner_text().startswith("live: updates every")
    states = listing.locator("tr.job td:nth-child(5)")
    ready = listing.locator("tr.job td:nth-child(5)", has_text="ready")
    assert ready.count() == 6, states.all_inner_texts()  # the ones enqueued while paused
    typed = listing.locator("#filters input[name=name]")
    typed.fill("pause.ma")  # not submitted: a person still typing
    listing.evaluate("() => { window.notReloaded = true; }")
    overview.locator("#paused button.resume-queue").click()
    overview.wait_for_url(url + "/")
    sync_api.expect(overview.locator("#paused")).to_have_count(0)
    # Waited for as completed, not as no longer ready: on a loaded machine a live update can
    # land between the claim and the write, and show a job running.
    completed = listing.locator("tr.job td:nth-child(5)", has_text="completed")
    sync_api.expect(completed).to_have_count(6, timeout=LIVE_WITHIN_MS)
    assert set(states.all_inner_texts()) == {"completed"}, states.all_inner_texts()
    assert typed.input_value() == "pause.ma"
    assert listing.evaluate("() => window.notReloaded") is True  # updated in place
    assert int(listing.evaluate("() => document.documentElement.dataset.liveUpdates")) >= 1
    listing.close()


def bulk(page: Any, url: str) -> None:
    """Tick every dead job shown and retry them; then delete every job of queue "reports"
    that waits, with the filter's "Delete all" (confirmed)."""
    page.goto(url + "/jobs?state=dead&refresh=0")
    dead = page.locator("input[name=job]").count()
    assert dead >= 1
    page.check("#select-all")
    assert page.locator("input[name=job]:checked").count() == dead
    page.click("#bulk-retry")
    sync_api.expect(page.locator("#notice")).to_have_text(f"Retried {dead} job{'s' * (dead != 1)}.")
    page.goto(url + "/jobs?queue=reports&state=ready&refresh=0")
    waiting = page.locator("tr.job").count()
    assert waiting >= 1
    page.click("#bulk-delete-matching")
    sync_api.expect(page.locator("#notice")).to_have_text(
        f"Deleted {waiting} job{'s' * (waiting != 1)}."
    )
    sync_api.expect(page.locator("#no-jobs")).to_be_visible()


if __name__ == "__main__":
    main(*sys.argv[1:3], *([""] if len(sys.argv) < 4 else sys.argv[3:4]))
