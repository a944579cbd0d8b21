# Real `jobs-trio worker` processes on one SQLite file: many workers share the work without
# a job lost or run twice, a SIGKILLed worker's job is re-claimed after its lease lapses, and
# SIGTERM drains (interrupted, attempt handed back, exit 0). The jobs are tests/apps/sqlite_app.
from __future__ import annotations

import functools
import signal
from pathlib import Path

import pytest
import trio

from jobs_trio._core.records import JobState
from jobs_trio.drivers._open_driver import open_driver
from tests.apps.sqlite_app import registry
from tests.helpers.process_helpers import assert_drained, record, started, until, worker_processes

pytestmark = pytest.mark.slow

APP = "tests.apps.sqlite_app"
workers = functools.partial(worker_processes, APP)


async def test_three_processes_run_3000_jobs_each_exactly_once(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    seen = tmp_path / "seen.txt"
    async with open_driver(url):  # the schema exists before three processes open the file
        pass
    async with workers(tmp_path, url, 3, "--concurrency", "50") as procs:
        await started(procs)
        async with open_driver(url) as driver:
            ids = await registry.require("app.record").enqueue_many(
                # Each run 50 ms: the batch lasts ~1 s at three workers' 150 slots, past each
                # idle worker's next look at the file (0.5 s). Without it, two fast workers
                # could finish the batch before the third looked, and the test read that as a
                # process that took no part.
                driver,
                [{"seen": str(seen), "pause": 0.05}] * 3000,
            )

            async def all_completed() -> bool:
                [bulk] = [s for s in await driver.stats() if s.queue == "bulk"]
                return bulk.depth.get(JobState.COMPLETED.value, 0) == 3000

            await until("3,000 jobs completed", 45, all_completed)
        for proc in procs:
            proc.signal(signal.SIGTERM)
        for proc in procs:
            assert await proc.exit_code(within=15) == 0, proc.output()
    lines = [line.split() for line in seen.read_text().splitlines()]
    ran = [job_id for job_id, _ in lines]
    assert len(ran) == 3000, "a job ran twice" if len(set(ran)) < len(ran) else "a job is missing"
    assert set(ran) == set(ids)
    # Every process took part: this is three workers sharing one file, not one doing it all.
    assert len({worker for _, worker in lines}) == 3


async def test_a_sigkilled_workers_job_is_claimed_after_its_lease_orphaned_its_attempt_not_counted(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    async with open_driver(url) as driver:
        job_id = await registry.require("app.hang").enqueue(driver, {"seconds": 60})

        async def body_entered() -> bool:
            return bool(await driver.load_steps(job_id))

        async with workers(tmp_path, url, 1, "--lease", "2") as [first]:
            await until("the job's body to start", 20, body_entered)
            first.signal(signal.SIGKILL)
            assert await first.exit_code(within=10) == -signal.SIGKILL
        killed = await record(driver, job_id)
        assert (killed.state, killed.attempts) == (JobState.RUNNING, 1)

        async with workers(tmp_path, url, 1, "--lease", "2") as [second]:

            async def completed() -> bool:
                return (await record(driver, job_id)).state is JobState.COMPLETED

            # The first claim's 2 s lease lapses, then the second worker's next look claims it.
            await until("the second worker to complete the job", 20, completed)
            second.signal(signal.SIGTERM)
            assert await second.exit_code(within=15) == 0, second.output()
        done = await record(driver, job_id)
        # Its worker died under it: orphaned (docs/model.md, "A worker's death"), the killed
        # run's attempt handed back, so the second run was attempt 1 again.
        assert (done.attempts, done.orphans) == (1, 1)
        assert done.result == {"attempt": 1}


async def test_sigterm_interrupts_a_running_job_without_costing_an_attempt(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    grace = 20.0
    async with open_driver(url) as driver:
        job_id = await registry.require("app.hang").enqueue(driver, {"seconds": 60})

        async def body_entered() -> bool:
            return bool(await driver.load_steps(job_id))

        async with workers(tmp_path, url, 1, "--grace", str(grace)) as [worker]:
            await until("the job's body to start", 20, body_entered)
            signalled = trio.current_time()
            worker.signal(signal.SIGTERM)
            code = await worker.exit_code(within=grace)
            took = trio.current_time() - signalled
            assert code == 0, worker.output()
        # The body hears the drain at once; nothing waits out the grace period (half of it: the
        # exit takes about a second, and a loaded machine adds a few).
        assert took < grace / 2, f"exit took {took:.1f} s"
        await assert_drained(driver, job_id, worker)
