# The dashboard an operator leaves open (issue 46), over real HTTP on SQLite and PostgreSQL: a
# queue paused and resumed from the overview, a job deleted or run now from its page, bulk
# retry / cancel / delete / run now of the jobs ticked or of every job a filter matches, each a
# POST the cross-site guard checks; the paused queues and each job name's run time and failure
# rate on the overview. In a real browser: tests/ops/test_dashboard_pause.py.
from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from jobs_trio._core.records import DeadLetter, JobState, NewJob, new_job_id
from tests.helpers.dashboard_site import Site, open_site, seed_history

KINDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.fixture(params=KINDS)
async def acting_site(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Site]:
    async with open_site(request.param, tmp_path, actions=True) as served:
        yield served


def token(page: str) -> str:
    found = re.search(r'<input type="hidden" name="csrf" value="([0-9a-f]+)">', page)
    assert found is not None, "no action form on the page"
    return found.group(1)


async def post(
    client: httpx.AsyncClient, site: Site, path: str, page: str, **fields: str | list[str]
) -> httpx.Response:
    return await client.post(
        path, headers={"origin": site.url}, data={"csrf": token(page), **fields}
    )


async def dead_jobs(site: Site, queue: str, n: int) -> list[str]:
    jobs = [NewJob(new_job_id(), "mail.bounce", queue, "{}", 1) for _ in range(n)]
    await site.writer.enqueue(jobs)
    for claim in await site.writer.claim([queue], n, lease=60, worker_id="w"):
        await site.writer.settle([DeadLetter(claim.lease, "bounced")])
    return [job.job_id for job in jobs]


async def test_a_queue_is_paused_and_resumed_from_the_overview(acting_site: Site) -> None:
    site = acting_site
    async with httpx.AsyncClient(base_url=site.url) as client:
        page = (await client.get("/")).text
        assert 'action="/queues/emails/pause"' in page and "Pause</button>" in page
        answer = await post(client, site, "/queues/emails/pause", page)
        assert answer.status_code == 303 and answer.headers["location"] == "/"
        assert [p.queue for p in await site.writer.queue_pauses()] == ["emails"]
        [pause] = await site.writer.queue_pauses()
        assert pause.by == "the dashboard"
        page = (await client.get("/")).text
        assert re.search(r"emails</a> <span class=\"paused\">paused</span>", page)
        paused = re.search(r'<div class="error" id="paused">(.*?)</div>', page, re.S)
        assert (
            paused is not None
            and "emails" in paused.group(1)
            and "the dashboard" in paused.group(1)
        )
        answer = await post(client, site, "/queues/emails/resume", page)
        assert answer.status_code == 303
        assert await site.writer.queue_pauses() == []
        # Another site's form pauses nothing.
        refused = await client.post(
            "/queues/emails/pause", headers={"origin": "https://evil.example"}, data={"csrf": "0"}
        )
        assert refused.status_code == 403 and "X_CROSS_SITE" in refused.text
    assert await site.writer.queue_pauses() == []


async def test_a_job_is_run_now_or_deleted_from_its_page(acting_site: Site) -> None:
    site = acting_site
    later = NewJob(new_job_id(), "report.build", "reports", "{}", 3, delay=3600)
    await site.writer.enqueue([later])
    async with httpx.AsyncClient(base_url=site.url) as client:
        page = (await client.get(f"/jobs/{later.job_id}")).text
        assert 'id="run-now"' in page and 'id="delete"' in page and 'id="retry"' not in page
        answer = await post(client, site, f"/jobs/{later.job_id}/run-now", page)
        assert answer.status_code == 303 and answer.headers["location"] == f"/jobs/{later.job_id}"
        record = await site.writer.get(later.job_id)
        assert record is not None and record.run_at <= site.writer.now()
        page = (await client.get(f"/jobs/{later.job_id}")).text
        assert 'id="run-now"' not in page  # due now: nothing to hurry
        answer = await post(client, site, f"/jobs/{later.job_id}/delete", page)
        assert answer.status_code == 303 and answer.headers["location"] == "/jobs?done=delete&n=1"
        assert await site.writer.get(later.job_id) is None
        listed = (await client.get(answer.headers["location"])).text
        assert '<p class="notice" id="notice">Deleted 1 job.</p>' in listed
        # A running job is not deleted: its page offers no Delete, and a POST is a 409.
        [running] = await site.writer.claim(["reports"], 1, lease=60, worker_id="w")
        page = (await client.get(f"/jobs/{running.job_id}")).text
        assert 'id="delete"' not in page
        refused = await post(client, site, f"/jobs/{running.job_id}/delete", page)
        assert refused.status_code == 409 and "cancel it first" in refused.text


async def test_bulk_actions_take_the_ticked_jobs_or_every_job_the_filter_matches(
    acting_site: Site,
) -> None:
    site = acting_site
    bounced = await dead_jobs(site, "bounces", 4)
    async with httpx.AsyncClient(base_url=site.url) as client:
        page = (await client.get("/jobs", params={"queue": "bounces", "state": "dead"})).text
        assert page.count('<input type="checkbox" name="job"') == 4
        # Two ticked, retried; the filter rides along for the way back.
        answer = await post(
            client,
            site,
            "/jobs/bulk",
            page,
            action="retry",
            job=bounced[:2],
            queue="bounces",
            state="dead",
        )
        assert answer.status_code == 303
        assert answer.headers["location"] == (
            "/jobs?state=dead&queue=bounces&done=retry&n=2&skipped=0"
        )
        states = [(await site.writer.get(i)).state for i in bounced]  # type: ignore[union-attr]
        assert states == [JobState.READY] * 2 + [JobState.DEAD] * 2
        listed = (await client.get(answer.headers["location"])).text
        assert "Retried 2 jobs." in listed
        # The same two again: changed since (ready now), skipped and counted.
        answer = await post(
            client, site, "/jobs/bulk", page, action="retry", job=bounced[:2], state="dead"
        )
        assert "n=0&skipped=2" in answer.headers["location"]
        # Every dead job of the queue, deleted; nothing else.
        answer = await post(
            client,
            site,
            "/jobs/bulk",
            page,
            action="delete matching",
            queue="bounces",
            state="dead",
        )
        assert "done=delete&n=2&skipped=0" in answer.headers["location"]
        remaining = {r.id for r in await site.writer.list_jobs(queue="bounces")}
        assert remaining == set(bounced[:2])
        # Every waiting job of the queue cancelled (the action's own default states).
        answer = await post(
            client, site, "/jobs/bulk", page, action="cancel matching", queue="bounces"
        )
        assert "done=cancel&n=2" in answer.headers["location"]
        # A filter's state the action cannot take is refused, naming the ones it can.
        refused = await post(
            client, site, "/jobs/bulk", page, action="retry matching", state="ready"
        )
        assert refused.status_code == 400 and "retry takes no ready job" in refused.text
        refused = await post(client, site, "/jobs/bulk", page, action="explode", job=bounced)
        assert refused.status_code == 400
    assert {r.state for r in await site.writer.list_jobs(queue="bounces")} == {JobState.CANCELLED}


async def test_bulk_actions_are_refused_when_actions_are_off(tmp_path: Path) -> None:
    async with open_site("sqlite", tmp_path) as site:
        bounced = await dead_jobs(site, "bounces", 1)
        async with httpx.AsyncClient(base_url=site.url) as client:
            page = (await client.get("/jobs")).text
            assert 'id="bulk"' not in page and 'name="job"' not in page
            for path, fields in (
                ("/jobs/bulk", {"action": "delete", "job": bounced[0]}),
                ("/queues/bounces/pause", {}),
                (f"/jobs/{bounced[0]}/delete", {}),
            ):
                answer = await client.post(
                    path, headers={"origin": site.url}, data={"csrf": "x", **fields}
                )
                assert answer.status_code == 403 and "X_ACTIONS_OFF" in answer.text, path
            record = await site.writer.get(bounced[0])
            assert record is not None and record.state is JobState.DEAD
            assert await site.writer.queue_pauses() == []


async def test_the_notice_says_only_an_actions_own_words(acting_site: Site) -> None:
    async with httpx.AsyncClient(base_url=acting_site.url) as client:
        forged = await client.get("/jobs", params={"done": "<b>owned</b>", "n": "1"})
        assert 'id="notice"' not in forged.text and "owned" not in forged.text
        odd = await client.get("/jobs", params={"done": "retry", "n": "-1"})
        assert 'id="notice"' not in odd.text


async def test_the_overview_shows_each_job_names_run_time_and_failure_rate(
    tmp_path: Path,
) -> None:
    async with open_site("sqlite", tmp_path) as site:
        await seed_history(site.database, site.options, minutes=3)
        async with httpx.AsyncClient(base_url=site.url) as client:
            page = (await client.get("/")).text
    rows = dict(
        re.findall(r'<tr class="name-row">\s*<td><a [^>]*>([^<]+)</a></td>(.*?)</tr>', page, re.S)
    )
    # The seeded jobs: mail.broken failed twice (a retry, a dead letter), mail.welcome
    # completed; seed_history's three minutes of invoice.send: 3, 10 and 6 completed, the last
    # minute one dead-lettered (each body 0.5 s). The most failures first, then the busiest.
    assert list(rows) == ["mail.broken", "invoice.send", "mail.welcome"]
    cells = dict(re.findall(r'<td class="num ([\w-]+)">([^<]*)</td>', rows["invoice.send"]))
    assert (cells["attempts"], cells["completed"], cells["dead-lettered"]) == ("20", "19", "1")
    assert cells["failure-rate"] == "5.0%"
    assert cells["mean-run"] == cells["longest-run"] != "-"
    broken = dict(re.findall(r'<td class="num ([\w-]+)">([^<]*)</td>', rows["mail.broken"]))
    assert (broken["retried"], broken["dead-lettered"], broken["failure-rate"]) == (
        "1",
        "1",
        "100.0%",
    )
