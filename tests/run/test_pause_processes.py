# A pause is strict once it returns (issue 46, DESIGN invariant 12), in a real worker process on
# SQLite and on PostgreSQL: jobs_trio.pause_queue returns once every worker holding jobs of the
# queue confirmed it heard, so a job that worker held for a slot never starts, even when its slot
# frees the instant the pause returns. Returning at the pause's commit, it started there before
# the worker's next look (SQLite: 5 of 5 held jobs; PostgreSQL, whose NOTIFY arrives after the
# commit: 2 or 3 in some runs), as the pause's caller went on believing the queue stopped.
from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import jobs_trio
from jobs_trio._core.records import JobState, NewJob, new_job_id
from jobs_trio.driver import Driver
from jobs_trio.drivers._open_driver import open_driver
from tests.helpers.process_helpers import record, started, until, worker_processes

pytestmark = pytest.mark.slow

APP = "tests.apps.pause_app"
HELD = 5


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def database(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[tuple[Driver, str, tuple[str, ...]]]:
    """A migrated database of either kind: a driver on it, its URL, and the worker's options
    that point at it (a schema of its own on the shared PostgreSQL server)."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'jobs.db'}"
        async with open_driver(url) as driver:
            yield driver, url, ()
        return
    from tests.conftest import require_postgres

    url, schema = require_postgres(), f"jt_{uuid.uuid4().hex[:12]}"
    async with open_driver(url, schema=schema, migrate=True, drop_schema_on_close=True) as driver:
        yield driver, url, ("--schema", schema)


async def _exists(path: Path) -> bool:
    return path.exists()


async def _running(driver: Driver, count: int) -> bool:
    return len(await driver.list_jobs(queue="held", state=JobState.RUNNING)) == count


async def test_no_held_job_starts_once_the_pause_has_returned(
    database: tuple[Driver, str, tuple[str, ...]], tmp_path: Path
) -> None:
    driver, url, where = database
    marks, release, long_started = (tmp_path / n for n in ("marks", "release", "started"))
    paths = {"marks": str(marks), "release": str(release), "started": str(long_started)}
    payload = json.dumps(paths)
    [long] = await driver.enqueue([NewJob(new_job_id(), "pause.long", "held", payload, 3)])
    quick = [NewJob(new_job_id(), "pause.quick", "held", payload, 3) for _ in range(HELD)]
    await driver.enqueue(quick)
    options = ("--queue", "held", "--concurrency", "1", "--claim-ahead", str(HELD))
    async with worker_processes(
        APP, tmp_path, url, 1, *where, *options, "--hold-limit", "120", "--no-tasks"
    ) as [worker]:
        await started([worker])
        # The long job runs in the one slot; the quick ones are claimed and held for it.
        await until("the long job to start", 20, lambda: _exists(long_started))
        await until("the quick jobs to be held", 20, lambda: _running(driver, HELD + 1))
        answer = await jobs_trio.pause_queue(driver, "held", by="test")
        release.touch()  # the slot frees now: a held job would start in it
        assert answer.confirmed and len(answer.heard) == 1, answer
        # Its held jobs went back before the pause returned; the long one ends.
        await until("the long job to end", 20, lambda: _running(driver, 0))
        assert (await record(driver, long.job_id)).state is JobState.COMPLETED
        for job in quick:
            back = await record(driver, job.job_id)
            assert (back.state, back.attempts) == (JobState.READY, 0), back
        assert not marks.exists(), marks.read_text()
        assert "jobs.worker.queue-paused" in worker.output()
