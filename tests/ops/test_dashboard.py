# The web dashboard over real HTTP (issue 17): hypercorn on 127.0.0.1 with a free port, a real
# SQLite file and a real PostgreSQL schema, read through the dashboard's read-only driver.
# Pages and filters, a job's steps, hostile stored text, and actions refused unless enabled.
from __future__ import annotations

import functools
import html
import re
import sys
import time
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path
from urllib.parse import urlencode

import httpx
import pytest
import trio

from jobs_trio import Registry
from jobs_trio._cli import main as cli
from jobs_trio._core.records import JobState, NewJob, new_job_id
from jobs_trio._dashboard import views
from jobs_trio.dashboard import (
    DashboardOptions,
    dashboard_app,
    open_dashboard_driver,
    read_only_url,
    serve_dashboard,
)
from jobs_trio.drivers._open_driver import open_driver
from tests.helpers.dashboard_site import (
    HOSTILE_ERROR,
    HOSTILE_NAME,
    TASK,
    TRACEBACK,
    WORKER,
    Site,
    open_site,
)

KINDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.fixture(params=KINDS)
async def site(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Site]:
    async with open_site(request.param, tmp_path) as served:
        yield served


@pytest.fixture(params=KINDS)
async def acting_site(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Site]:
    async with open_site(request.param, tmp_path, actions=True) as served:
        yield served


async def get(site: Site, path: str, **kw: object) -> httpx.Response:
    async with httpx.AsyncClient(base_url=site.url) as client:
        return await client.get(path, **kw)  # type: ignore[arg-type]


def row_ids(page: str) -> list[str]:
    """The job ids of a job list page, in the order shown."""
    return re.findall(r'<tr class="job">\s*<td><a href="/jobs/([0-9a-f]+)"', page)


# Pages.


def cells_of(page: str, queue: str) -> dict[str, str]:
    """A queue's row on the overview: each count cell by its class."""
    rows = re.findall(r'<tr class="queue">(.*?)</tr>', page, re.S)
    [row] = [r for r in rows if f"?queue={queue}" in r]
    return dict(re.findall(r'<td class="num (\w+)">(?:<a [^>]*>)?(\d+)', row))


async def test_the_overview_counts_each_queue_with_due_and_delayed_apart(site: Site) -> None:
    answer = await get(site, "/")
    assert answer.status_code == 200
    assert cells_of(answer.text, "emails") == {
        "due": "1",  # the hostile-named job, ready and due
        "delayed": "0",
        "running": "0",
        "suspended": "0",
        "parked": "0",
        "dead": "1",
        "completed": "1",
        "cancelled": "0",
    }
    assert cells_of(answer.text, "reports")["due"] == "1"
    # A job delayed an hour is not "due": the page tells the two apart, in the totals too.
    await site.writer.enqueue(
        [NewJob(new_job_id(), "report.build", "reports", "{}", 3, delay=3600)]
    )
    page = (await get(site, "/")).text
    assert cells_of(page, "reports")["due"] == "1" and cells_of(page, "reports")["delayed"] == "1"
    assert re.search(r'id="total-due"><div class="n">2<', page)
    assert re.search(r'id="total-delayed"><div class="n">1<', page)
    # The features the page once said "appear here once this version ..." are here.
    assert "appears here once" not in page and "placeholder" not in page


def bars(page: str, chart: str) -> list[int]:
    svg = re.search(rf'<svg id="{chart}".*?</svg>', page, re.S)
    assert svg is not None, chart
    return [int(n) for n in re.findall(r"<title>\d\d:\d\d: (\d+)</title>", svg.group(0))]


async def test_the_overview_charts_completions_and_failures_per_minute(site: Site) -> None:
    page = (await get(site, "/")).text
    completed, failed = bars(page, "chart-completed"), bars(page, "chart-failed")
    assert len(completed) == len(failed) == views.CHART_MINUTES
    # Seeded a moment ago: one completion; one retry and one dead letter, this minute (or the
    # last, when the minute turned in between).
    assert sum(completed[-2:]) == 1 and sum(failed[-2:]) == 2
    assert sum(completed[:-2]) == sum(failed[:-2]) == 0


async def test_the_overview_lists_live_workers_cron_tasks_and_the_outbox(site: Site) -> None:
    page = (await get(site, "/")).text
    workers = re.findall(r'<tr class="worker">\s*<td>([^<]*)</td>\s*<td>([^<]*)</td>', page)
    assert workers == [(WORKER, "box-1")]
    assert "0 / 10" in page and "emails, reports" in page
    [task] = re.findall(r'<tr class="task">(.*?)</tr>', page, re.S)
    assert TASK in task and f'href="/jobs/{site.jobs.report}"' in task
    assert "1m00s ago" in task  # its last fire stood for a minute ago
    assert 'id="tasks-no-registry"' in page  # schedules need the registry
    assert re.search(r'id="outbox-pending">1<', page)
    # A worker that stops announcing itself drops off the list once two intervals pass.
    await site.writer.worker_gone(WORKER)
    page = (await get(site, "/")).text
    assert 'id="no-workers"' in page


async def test_the_outbox_shows_the_rows_each_relay_holds_and_a_lapsed_hold(site: Site) -> None:
    assert 'id="outbox-held"' not in (await get(site, "/")).text  # nothing held: no table
    writer = site.writer
    source = await writer.outbox_source()
    await writer.outbox_write([NewJob(new_job_id(), "mail.later", "emails", "{}", 3)])
    for relay_id, lease in (("relay-b", 3600.0), ("relay-a", 0.0)):  # a's lapsed at once
        ticket = await writer.relay_ticket(source, relay_id=relay_id, lease=60.0)
        await writer.outbox_claim(1, lease=lease, relay_id=relay_id, ticket=ticket)
    page = (await get(site, "/")).text
    [lapsed] = re.findall(r'<tr class="relay-hold lapsed">(.*?)</tr>', page, re.S)
    assert "relay-a" in lapsed and '<td class="num">1</td>' in lapsed
    assert "the relay died or is paused" in lapsed
    [live] = re.findall(r'<tr class="relay-hold">(.*?)</tr>', page, re.S)
    assert "relay-b" in live and "in 59m" in live


async def test_with_the_registry_each_task_shows_its_schedule_and_next_fire(
    tmp_path: Path,
) -> None:
    registry = Registry()

    @registry.task(TASK, every=600)
    async def nightly(ctx: object, payload: object) -> None: ...

    @registry.task("hourly", cron="0 0 * * * *")
    async def hourly(ctx: object, payload: object) -> None: ...

    async with open_site("sqlite", tmp_path, registry=registry) as site:
        page = (await get(site, "/")).text
    rows = re.findall(r'<tr class="task">(.*?)</tr>', page, re.S)
    assert [re.search(r"<td>([^<]*)</td>", r).group(1) for r in rows] == ["hourly", TASK]  # type: ignore[union-attr]
    # The next ten-minute mark after the fire a minute ago: shown as ahead ("in 4m10s", or
    # seconds alone under a minute) unless a mark fell in that minute, which nothing fired yet
    # (no scheduler runs here): then it is overdue ("49s ago").
    assert "every 600 s" in rows[1]
    next_fire, last_fired = (
        datetime.fromisoformat(title).timestamp()
        for title in re.findall(r'<span title="([^"]+)">', rows[1])[:2]
    )
    assert next_fire == (last_fired // 600 + 1) * 600, rows[1]
    ahead = r'">in (\d+m\d\ds|\d+(\.\d)?s)</span>'
    overdue = r'">(\d+(\.\d+)?s) ago</span>'
    assert re.search(ahead if next_fire > time.time() else overdue, rows[1]), rows[1]
    assert "cron &#39;0 0 * * * *&#39; UTC" in rows[0] and "-</td>" in rows[0]
    assert 'id="tasks-no-registry"' not in page


async def test_the_pages_update_themselves_with_the_dashboards_own_script_and_pause(
    tmp_path: Path,
) -> None:
    async with open_site("sqlite", tmp_path, refresh=2) as site:
        live = (await get(site, "/", params={"queue": "em"})).text
        paused = (await get(site, "/", params={"queue": "em", "refresh": "0"})).text
        job = (await get(site, f"/jobs/{site.jobs.dead}")).text
        listing = (await get(site, "/jobs", params={"state": "dead"})).text
        script = await get(site, "/live.js")
    # The script swaps in the page's live parts; without scripts the page reloads itself.
    for page in (live, job, listing):
        assert '<body data-refresh="2.0">' in page
        assert '<noscript><meta http-equiv="refresh" content="2"></noscript>' in page
        assert re.findall(r"<script[^>]*>", page) == ['<script src="/live.js" defer>']
        assert "</script>" in page and "<script>" not in page  # no inline script, anywhere
        assert "data-live" in page
    assert 'href="?queue=em&amp;refresh=0" id="pause"' in live
    assert '<body data-refresh="0.0">' in paused and "http-equiv" not in paused
    assert 'href="?queue=em" id="resume"' in paused
    assert '<input type="hidden" name="refresh" value="0">' in paused  # the filter keeps it
    assert 'href="?state=dead&amp;refresh=0" id="pause"' in listing  # the job list is live too
    assert script.status_code == 200 and script.headers["content-type"].startswith(
        "text/javascript"
    )
    policy = script.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "connect-src 'self'" in policy
    assert "default-src 'none'" in policy and "unsafe-inline" not in policy.split("style-src")[0]


async def test_a_job_page_shows_each_attempt_with_its_traceback(site: Site) -> None:
    page = (await get(site, f"/jobs/{site.jobs.dead}")).text
    rows = re.findall(r'<tr class="attempt">(.*?)</tr>', page, re.S)
    assert len(rows) == 2  # newest first: the dead letter, then the retry
    assert "dead-lettered" in rows[0] and "retried" in rows[1]
    assert all(WORKER in row and "0.50s" in row for row in rows)
    tracebacks = re.findall(
        r'<details class="traceback"><summary>traceback</summary><pre>(.*?)</pre>', page, re.S
    )
    assert [html.unescape(t) for t in tracebacks] == [TRACEBACK.replace("\x1b", "\\x1b")] * 2
    assert "<b>boom</b>" not in page  # markup in a traceback is text
    done = (await get(site, f"/jobs/{site.jobs.completed}")).text
    [row] = re.findall(r'<tr class="attempt">(.*?)</tr>', done, re.S)
    assert "completed" in row and "traceback" not in row
    fresh = (await get(site, f"/jobs/{site.jobs.report}")).text
    assert 'id="no-attempts"' in fresh


async def test_the_overview_stays_small_with_10000_queues() -> None:
    """The overview of 10,000 queues lists the 100 busiest and says how many it left out (it
    was 16.9 MB and 11.5 s: a row, and a throughput read, per queue). Its time is measured in
    bench/dashboard_overview.py, not asserted here."""
    async with open_driver("memory://") as driver:
        await driver.enqueue(
            [NewJob(new_job_id(), "j", f"q{n:05}", "{}", 3) for n in range(10_000)]
            + [NewJob(new_job_id(), "j", "busy", "{}", 3) for _ in range(5)]
        )
        app = dashboard_app(driver)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            page = (await client.get("/")).text
            found = (await client.get("/", params={"queue": "q0999"})).text
    assert len(page) < 150_000, len(page)
    rows = re.findall(r'<tr class="queue">', page)
    assert len(rows) == views.MAX_QUEUE_ROWS
    assert cells_of(page, "busy")["due"] == "5"  # the busiest first
    assert "The 100 busiest of 10001 queues are shown" in page
    assert re.search(r'id="total-due"><div class="n">10005<', page)
    assert len(re.findall(r'<tr class="queue">', found)) == 10  # q09990 ... q09999


async def test_the_job_list_is_newest_first_and_every_filter_narrows_it(site: Site) -> None:
    jobs = site.jobs
    everything = row_ids((await get(site, "/jobs")).text)
    listed = await site.writer.list_jobs(limit=100)
    assert everything == [r.id for r in listed]  # the driver's newest-first order
    assert set(everything) == {jobs.completed, jobs.dead, jobs.hostile, jobs.report}

    by_state = row_ids((await get(site, "/jobs", params={"state": "dead"})).text)
    assert by_state == [jobs.dead]
    by_queue = row_ids((await get(site, "/jobs", params={"queue": "reports"})).text)
    assert by_queue == [jobs.report]
    by_name = row_ids((await get(site, "/jobs", params={"name": "mail."})).text)
    assert sorted(by_name) == sorted([jobs.completed, jobs.dead])
    combined = {"state": "ready", "queue": "emails", "name": "<script>"}
    assert row_ids((await get(site, "/jobs", params=combined)).text) == [jobs.hostile]
    none = await get(site, "/jobs", params={"queue": "emails", "state": "cancelled"})
    assert row_ids(none.text) == [] and 'id="no-jobs"' in none.text


async def test_the_job_list_pages(site: Site, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(views, "PAGE_SIZE", 3)
    first = await get(site, "/jobs")
    second = await get(site, "/jobs", params={"page": "2"})
    assert len(row_ids(first.text)) == 3 and len(row_ids(second.text)) == 1
    assert row_ids(first.text) + row_ids(second.text) == row_ids(
        (await get(site, "/jobs", params={"page": "1"})).text
    ) + row_ids(second.text)
    assert 'id="next"' in first.text and 'id="next"' not in second.text
    assert 'href="?page=1" id="previous"' in second.text


async def test_a_job_page_shows_payload_result_error_attempts_and_steps(site: Site) -> None:
    done = await get(site, f"/jobs/{site.jobs.completed}")
    assert done.status_code == 200
    steps = re.findall(r'<tr class="step">\s*<td>([^<]*)</td>\s*<td>(\w+)</td>', done.text)
    assert steps == [("render", "done"), ("send", "done")]
    assert "0.25s" in done.text  # each step's duration
    assert "&#34;message_id&#34;: 42" in done.text  # a step's stored result
    assert re.search(r'<pre id="result">\{\n  &#34;sent&#34;: true\n\}</pre>', done.text)
    assert re.search(r'<pre id="payload">\{\n  &#34;to&#34;: &#34;a@b.c&#34;\n\}</pre>', done.text)
    assert "1/3" in done.text  # attempts counted at claim
    dead = await get(site, f"/jobs/{site.jobs.dead}")
    assert "No step records." in dead.text
    shown_error = re.search(r'<pre id="last-error">(.*?)</pre>', dead.text, re.S)
    assert shown_error is not None
    assert html.unescape(shown_error.group(1)) == HOSTILE_ERROR.replace("\x1b", "\\x1b")


# Hostile stored text.


async def test_hostile_names_errors_and_payloads_render_as_text_not_markup(site: Site) -> None:
    for path in ("/", "/jobs", f"/jobs/{site.jobs.hostile}", f"/jobs/{site.jobs.dead}"):
        page = (await get(site, path)).text
        # The only tags are the template's own: none of the stored markup became an element
        # (the one script tag is the dashboard's own, from its own origin).
        assert re.findall(r"<script[^>]*>", page) == ['<script src="/live.js" defer>'], path
        assert "<img" not in page, path
        assert "\x1b" not in page and "\x00" not in page and "\u202e" not in page, path
    page = (await get(site, f"/jobs/{site.jobs.hostile}")).text
    name = re.search(r'<span id="job-name">(.*?)</span>', page)
    assert name is not None
    expected = HOSTILE_NAME.replace("\x1b", "\\x1b").replace("\x07", "\\x07")
    assert html.unescape(name.group(1)) == expected.replace("\u202e", "\\u202e")
    payload = re.search(r'<pre id="payload">(.*?)</pre>', page, re.S)
    assert payload is not None
    shown = html.unescape(payload.group(1))
    assert "</pre><script>alert(2)</script>" in shown  # as text, inside the <pre>
    assert '"nul": "\\u0000"' in shown and '"half": "\\udcff"' in shown
    # No page may run a script of anyone else's even if something slipped through.
    answer = await get(site, "/jobs")
    policy = answer.headers["content-security-policy"]
    assert "default-src 'none'" in policy and "script-src 'self';" in policy
    assert answer.headers["x-frame-options"] == "DENY"


# Actions.


async def test_actions_are_refused_when_off_and_the_database_is_opened_read_only(
    site: Site, tmp_path: Path
) -> None:
    dead = site.jobs.dead
    async with httpx.AsyncClient(base_url=site.url) as client:
        for action in ("retry", "cancel"):
            answer = await client.post(
                f"/jobs/{dead}/{action}", headers={"origin": site.url}, data={"csrf": "x"}
            )
            assert answer.status_code == 403
            assert "X_ACTIONS_OFF" in answer.text and "--actions" in answer.text
        page = await client.get(f"/jobs/{dead}")
        assert 'id="retry"' not in page.text and "read-only" in page.text
    record = await site.writer.get(dead)
    assert record is not None and record.state is JobState.DEAD
    # And below the web layer: the dashboard's own driver cannot write either.
    url = site.writer.url
    options = {"schema": site.writer.schema} if url.startswith("postgres") else {}  # type: ignore[attr-defined]
    async with open_dashboard_driver(url, options, actions=False) as reader:
        with pytest.raises(Exception, match=r"(?i)read.?only"):
            await reader.retry(dead)
    record = await site.writer.get(dead)
    assert record is not None and record.state is JobState.DEAD


def form_token(page: str, action: str) -> str:
    match = re.search(rf'/{action}">\s*<input type="hidden" name="csrf" value="([0-9a-f]+)">', page)
    assert match is not None, f"no {action} form on the page"
    return match.group(1)


async def test_enabled_actions_work_from_the_dashboards_own_page(acting_site: Site) -> None:
    site, dead, ready = acting_site, acting_site.jobs.dead, acting_site.jobs.report
    async with httpx.AsyncClient(base_url=site.url) as client:
        page = await client.get(f"/jobs/{dead}")
        cookie = page.headers["set-cookie"]
        assert "httponly" in cookie.lower() and "samesite=strict" in cookie.lower()
        answer = await client.post(
            f"/jobs/{dead}/retry",
            headers={"origin": site.url},
            data={"csrf": form_token(page.text, "retry")},
        )
        assert answer.status_code == 303 and answer.headers["location"] == f"/jobs/{dead}"
        page = await client.get(f"/jobs/{ready}")
        answer = await client.post(
            f"/jobs/{ready}/cancel",
            headers={"referer": f"{site.url}/jobs/{ready}"},  # a browser that sends no Origin
            data={"csrf": form_token(page.text, "cancel")},
        )
        assert answer.status_code == 303
        # A transition the job's state does not allow is a 409 with the reason, not a 500.
        again = await client.post(
            f"/jobs/{ready}/cancel",
            headers={"origin": site.url},
            data={"csrf": form_token(page.text, "cancel")},
        )
        assert again.status_code == 409 and "can no longer be cancelled" in again.text
    retried, cancelled = await site.writer.get(dead), await site.writer.get(ready)
    assert retried is not None and (retried.state, retried.attempts) == (JobState.READY, 0)
    assert cancelled is not None and cancelled.state is JobState.CANCELLED


async def test_cross_site_posts_are_refused_even_with_actions_on(acting_site: Site) -> None:
    site, dead = acting_site, acting_site.jobs.dead
    async with httpx.AsyncClient(base_url=site.url) as client:
        page = await client.get(f"/jobs/{dead}")
        token = form_token(page.text, "retry")
        attempts = {
            "another site's Origin": ({"origin": "https://evil.example"}, {"csrf": token}),
            "no Origin or Referer": ({}, {"csrf": token}),
            "no token": ({"origin": site.url}, {}),
            "a forged token": ({"origin": site.url}, {"csrf": "0" * 64}),
            # Not ASCII: hmac.compare_digest refuses to compare such a str (a 500, not a 403).
            "a forged token not ASCII": ({"origin": site.url}, {"csrf": "é" * 64}),
            "a token of bytes not UTF-8": ({"origin": site.url}, {"csrf": "\udcff"}),
        }
        for why, (headers, form) in attempts.items():
            answer = await client.post(
                f"/jobs/{dead}/retry",
                headers={**headers, "content-type": "application/x-www-form-urlencoded"},
                content=urlencode(form, encoding="utf-8", errors="surrogateescape"),
            )
            assert answer.status_code == 403, why
            assert "X_CROSS_SITE" in answer.text, why
    # A browser without the cookie (another site's form, cookie withheld by SameSite) fails.
    async with httpx.AsyncClient(base_url=site.url) as stranger:
        answer = await stranger.post(
            f"/jobs/{dead}/retry", headers={"origin": site.url}, data={"csrf": token}
        )
        assert answer.status_code == 403
    record = await site.writer.get(dead)
    assert record is not None and record.state is JobState.DEAD


# Refusals and errors.


async def test_a_foreign_host_name_is_refused(site: Site) -> None:
    # A DNS-rebinding page reaches 127.0.0.1 under its own name: it must not read the jobs.
    answer = await get(site, "/jobs", headers={"host": "evil.example"})
    assert answer.status_code == 400 and site.jobs.dead not in answer.text


async def test_bad_filters_and_unknown_jobs_are_clear_errors(site: Site) -> None:
    bad_state = await get(site, "/jobs", params={"state": "<b>nope</b>"})
    assert bad_state.status_code == 400
    assert "is not a job state" in bad_state.text and "<b>nope" not in bad_state.text
    assert (await get(site, "/jobs", params={"page": "0"})).status_code == 400
    assert (await get(site, "/jobs", params={"queue": "a\x00b"})).status_code == 400
    # A control character in any filter is refused, never reflected into the filter box raw.
    for path, field in (("/jobs", "name"), ("/jobs", "queue"), ("/", "queue")):
        refused = await get(site, path, params={field: "mail\x1b[31m"})
        assert refused.status_code == 400, (path, field)
        assert "\x1b" not in refused.text and "\\x1b" in refused.text
    missing = await get(site, "/jobs/0123abc")
    assert missing.status_code == 404 and "no job with id" in missing.text


def test_read_only_url_sets_the_postgres_session_read_only_and_keeps_other_options() -> None:
    assert read_only_url(
        "postgresql://u@h/db?sslmode=disable&default_transaction_read_only=off"
    ) == ("postgresql://u@h/db?sslmode=disable&default_transaction_read_only=on")
    assert read_only_url("sqlite:///jobs.db") == "sqlite:///jobs.db"


# The command.


def test_the_command_without_its_extra_is_one_clear_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    for module in list(sys.modules):
        if module.startswith(("jobs_trio.dashboard", "jobs_trio._dashboard")):
            monkeypatch.delitem(sys.modules, module)
        elif module.split(".")[0] == "starlette":
            monkeypatch.setitem(sys.modules, module, None)  # None: what an uninstalled one is
    code = cli.main(["dashboard", "--db", f"sqlite:///{tmp_path / 'jobs.db'}"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1
    assert err.startswith("error [X_CONFIG]: the dashboard needs packages that are not installed")
    assert "pip install 'jobs-trio[dashboard]'" in err


async def test_a_dashboard_bound_beyond_loopback_warns_as_it_starts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with open_driver("memory://") as driver:
        for host, warned in (("127.0.0.1", False), ("0.0.0.0", True)):
            caplog.clear()
            async with trio.open_nursery() as nursery:
                options = DashboardOptions(host=host, port=0)
                await nursery.start(functools.partial(serve_dashboard, driver, options))
                nursery.cancel_scope.cancel()
            exposed = [
                r for r in caplog.records if getattr(r, "event", "") == "jobs.dashboard.exposed"
            ]
            assert bool(exposed) is warned, host
    [record] = exposed
    assert record.levelname == "WARNING"
    assert "every address of this machine" in record.fields["why"]  # type: ignore[attr-defined]
    assert "authenticating reverse proxy" in record.fields["fix"]  # type: ignore[attr-defined]
