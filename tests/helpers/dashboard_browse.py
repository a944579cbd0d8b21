# Drives headless Chromium through the dashboard for tests/ops/test_dashboard_browser.py, in a
# process of its own: Playwright needs a plain asyncio, which trio-asyncio changes process-wide.
# Usage: python -m tests.helpers.dashboard_browse URL JOBS_JSON CHROMIUM [SCREENSHOT_DIR]
# Talks to the test on stdin/stdout for the live update: prints "LOADED <n>" once the overview
# shows n jobs due, waits for a line from the test (which enqueues more), then watches the open
# page change by itself, its first request after that left unanswered.
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from playwright import sync_api

from tests.helpers.dashboard_site import HOSTILE_NAME, TASK, WORKER, Seeded

# The page reloads every second (the test serves it so): a change shows within a few reloads.
LIVE_WITHIN_MS = 15_000


def main(url: str, jobs_json: str, chromium: str, shots: str) -> None:
    jobs = Seeded(**json.loads(jobs_json))
    browse(url, jobs, chromium, Path(shots) if shots else None)


def browse(url: str, jobs: Seeded, chromium: str, shots: Path | None) -> None:
    def shot(page: Any, name: str, selector: str | None = None) -> None:
        if shots is None:
            return
        path = str(shots / f"dashboard-{name}.png")
        if selector is None:
            page.screenshot(path=path, full_page=True)
        else:
            page.locator(selector).screenshot(path=path)

    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            dialogs: list[str] = []
            page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))

            overview(page, url, jobs, shot)
            live_update(page, url)

            page.goto(url + "/jobs")
            assert page.locator("tr.job").count() >= 4
            # The filter form, as a person uses it.
            page.select_option("select[name=state]", "dead")
            page.click("#filters button")
            page.wait_for_url("**/jobs?state=dead**")
            assert "mail.broken" in _texts(page, "tr.job td.name")
            page.goto(url + "/jobs?queue=emails")
            shot(page, "jobs")

            # The hostile name is text in the DOM: no element came from it, no script ran.
            names = _texts(page, "tr.job td.name")
            assert any(n.startswith('<script>alert("name")</script><img') for n in names)
            assert page.locator("main script, main img").count() == 0
            assert dialogs == []

            page.click(f"a[href='/jobs/{jobs.completed}']")
            # A job's page reloads itself (every second here): expect() looks again across a
            # reload, where a single read could land in the middle of one.
            sync_api.expect(page.locator("tr.step td:first-child")).to_have_text(["render", "send"])
            shot(page, "job")

            attempts(page, url, jobs, shot)

            page.goto(f"{url}/jobs/{jobs.hostile}?refresh=0")
            shown = page.inner_text("#job-name")
            assert shown.startswith(HOSTILE_NAME[:40]) and "\\x1b" in shown
            assert dialogs == []

            # Actions are off: no button, and a POST from the page's own origin is refused.
            assert page.locator("#retry, #cancel").count() == 0
            # (A form posted from the page is what a person, or a page someone tricked them
            # into, would send.)
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


def overview(page: Any, url: str, jobs: Seeded, shot: Any) -> None:
    """Each section of the overview, as a browser lays it out: paused (?refresh=0), so no
    reload lands between a look and the next."""
    page.goto(url + "/?refresh=0")
    # Due now and delayed apart, in the totals and per queue.
    assert page.inner_text("#total-due .what").startswith("due now")
    assert page.inner_text("#total-delayed .what").startswith("delayed")
    rows = {_cell(row, "td:first-child"): row for row in page.locator("tr.queue").all()}
    assert {"emails", "reports", "invoices"} <= set(rows)
    assert _cell(rows["reports"], "td.due") == "1"
    # The charts: 60 bars each, with an hour of completions and failures behind them.
    for chart in ("#chart-completed", "#chart-failed"):
        assert page.locator(f"{chart} rect.bar").count() == 60, chart
        assert page.locator(chart).bounding_box()["width"] > 600, chart
    completed = page.get_attribute("#chart-completed", "aria-label")
    assert completed is not None and sum(int(n) for n in completed.split(": ")[1].split(", ")) > 60
    shot(page, "charts", "#charts")
    # Workers, cron tasks and the outbox.
    assert _texts(page, "tr.worker td:first-child") == [WORKER]
    shot(page, "workers", "#workers")
    [task] = page.locator("tr.task").all()
    assert _cell(task, "td:first-child") == TASK
    # Its schedule and next fire, from the registry (ahead, or overdue when a ten-minute mark
    # fell since its last fire: no scheduler runs here).
    assert _cell(task, "td:nth-child(2)") == "every 600 s"
    next_fire = _cell(task, "td:nth-child(3)")
    assert next_fire.startswith("in ") or next_fire.endswith(" ago"), next_fire
    assert task.locator(f"a[href='/jobs/{jobs.report}']").count() == 1
    shot(page, "tasks", "#tasks")
    assert page.inner_text("#outbox-pending") == "1"
    shot(page, "outbox", "#outbox")
    shot(page, "queues")  # the whole overview


def live_update(page: Any, url: str) -> None:
    """The open overview shows new work by itself, in place: no click, no navigation of ours,
    and a filter being typed keeps its text (issue 46: the page's reload wiped it)."""
    page.goto(url + "/")
    assert page.inner_text("#live").startswith("live: updates every")
    assert page.get_attribute("body", "data-refresh") == "1.0"
    typed = page.locator("#queue-filter input[name=queue]")
    typed.fill("emai")  # not submitted: a person still typing
    page.evaluate("() => { window.notReloaded = true; }")
    due = int(page.inner_text("#total-due .n"))
    # The next update's request is never answered (a server that stopped answering): the
    # page must give up on it and ask again, not stop updating for good.
    unanswered: list[Any] = []

    def hold_the_first(route: Any) -> None:
        if unanswered:
            route.continue_()
        else:
            unanswered.append(route)

    page.route(url + "/", hold_the_first)
    print(f"LOADED {due}", flush=True)
    sys.stdin.readline()  # the test enqueued three more due jobs
    sync_api.expect(page.locator("#total-due .n")).to_have_text(
        str(due + 3), timeout=LIVE_WITHIN_MS
    )
    assert typed.input_value() == "emai"
    assert page.evaluate("() => window.notReloaded") is True
    assert len(unanswered) == 1
    page.unroute(url + "/")
    # Paused, it stays as it is.
    page.click("#pause")
    page.wait_for_url("**refresh=0**")
    assert page.get_attribute("body", "data-refresh") == "0.0"
    assert page.inner_text("#live").startswith("paused")


def attempts(page: Any, url: str, jobs: Seeded, shot: Any) -> None:
    """A job's attempts, newest first, each traceback one click away (no script: <details>)."""
    page.goto(f"{url}/jobs/{jobs.dead}?refresh=0")
    outcomes = _texts(page, "tr.attempt td:nth-child(3)")
    assert outcomes == ["dead-lettered", "retried"]
    traceback = page.locator("tr.attempt details.traceback").first
    assert not traceback.locator("pre").is_visible()
    traceback.locator("summary").click()
    assert traceback.locator("pre").is_visible()
    assert "RuntimeError: <b>boom</b>" in traceback.locator("pre").inner_text()
    assert page.locator("main b").count() == 0  # the markup in it stayed text
    shot(page, "attempts", "#attempts")


def _cell(row: Any, selector: str) -> str:
    return str(row.locator(selector).inner_text()).strip()


def _texts(page: Any, selector: str) -> list[str]:
    return [str(t) for t in page.locator(selector).all_inner_texts()]


if __name__ == "__main__":
    main(*sys.argv[1:5], *([""] if len(sys.argv) < 5 else []))
