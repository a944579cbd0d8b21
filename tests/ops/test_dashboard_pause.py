# Pause from a real browser, two real worker processes (issue 46, DESIGN invariant 12): the
# overview's Pause stops queue "mail" on both (jobs enqueued to it then stay ready, while each
# worker runs a canary of its own queue, so each claimed again after the pause), Resume runs them,
# and the live job list shows it in place, a half-typed filter untouched; then the list's bulk
# retry of the jobs ticked and delete of every job a filter matches. Screenshots go to
# $JOBS_TRIO_SCREENSHOTS when set.
from __future__ import annotations

import os
from pathlib import Path

import pytest

from jobs_trio._core.records import JobState, NewJob, new_job_id
from tests.helpers.browser_process import a_browser
from tests.helpers.dashboard_site import open_site
from tests.helpers.process_helpers import started, until, worker_processes
from tests.ops.test_dashboard_browser import CHROMIUM, _browser_or_skip

APP = "tests.apps.pause_app"


@pytest.mark.slow
async def test_pause_from_the_browser_stops_two_workers_and_resume_runs_the_jobs(
    tmp_path: Path,
) -> None:
    _browser_or_skip()
    async with open_site("sqlite", tmp_path, actions=True, refresh=0.5) as site:
        writer = site.writer

        async def job(name: str, queue: str) -> str:
            [answer] = await writer.enqueue([NewJob(new_job_id(), name, queue, "1", 3)])
            return answer.job_id

        async def done(*ids: str) -> bool:
            records = [await writer.get(i) for i in ids]
            return all(r is not None and r.state is JobState.COMPLETED for r in records)

        options = ("--concurrency", "2", "--no-tasks")
        async with (
            worker_processes(
                APP, tmp_path, site.database, 1, "--queue", "mail", "--queue", "canary-a", *options
            ) as first,
            worker_processes(
                APP, tmp_path, site.database, 1, "--queue", "mail", "--queue", "canary-b", *options
            ) as second,
        ):
            workers = [*first, *second]
            # Queue "mail" on the overview, for its Pause button: a job of its own an hour off.
            await writer.enqueue([NewJob(new_job_id(), "pause.later", "mail", "1", 3, delay=3600)])
            # The browser starts beside the workers: each of the two takes a second or two.
            async with a_browser(
                "tests.helpers.dashboard_pause_browse",
                site.url,
                CHROMIUM,
                os.environ.get("JOBS_TRIO_SCREENSHOTS", ""),
                log=tmp_path / "browse.log",
            ) as browse:
                await started(workers)
                assert await browse.said() == "PAUSED"
                assert [p.queue for p in await writer.queue_pauses()] == ["mail"]
                held = [await job("pause.mail", "mail") for _ in range(6)]
                # Enqueued after the mail jobs: a claim that could take mail takes those first.
                canaries = [
                    await job("pause.canary_a", "canary-a"),
                    await job("pause.canary_b", "canary-b"),
                ]
                await until("each worker to run its canary", 20, lambda: done(*canaries))
                for job_id in held:  # each worker claimed since the pause: none started
                    record = await writer.get(job_id)
                    assert record is not None, job_id
                    assert (record.state, record.attempts) == (JobState.READY, 0), record
                await browse.tell("resume")
                assert await browse.said() == "RESUMED"
                assert await done(*held)
                assert await browse.said() == "BULK"
                await browse.ended()
            # Each worker heard the pause and the resume (its watch on the pauses).
            for worker in workers:
                assert "jobs.worker.queue-paused" in worker.output(), worker.output()
                assert "jobs.worker.queue-resumed" in worker.output(), worker.output()
        # The bulk actions, as the database has them: the dead retried, "reports" emptied.
        assert await writer.list_jobs(state=JobState.DEAD) == []
        assert await writer.list_jobs(queue="reports", state=JobState.READY) == []
