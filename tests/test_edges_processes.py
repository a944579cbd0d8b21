# The worker's promise at its edges (issue 32), in real `jobs-trio worker` processes on SQLite and
# PostgreSQL: a SIGTERM during start-up, two SIGTERMs 5 ms apart, a body that leaves a thread
# behind, one that forks, one that blocks the event loop. The jobs are tests/apps/edges_app.
from __future__ import annotations

import functools
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

from jobs_trio.driver import Driver
from jobs_trio.open_driver import open_driver
from jobs_trio.records import JobState
from tests.apps.edges_app import wait
from tests.conftest import require_postgres
from tests.process_helpers import record, started, until, worker_processes
from tests.test_processes_postgres import fresh_database

pytestmark = pytest.mark.slow

workers = functools.partial(worker_processes, "tests.apps.edges_app")


@pytest.fixture(params=["sqlite", "postgres"])
async def url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'jobs.db'}"
        return
    async with fresh_database(require_postgres()) as database:
        yield database


@pytest.fixture
async def driver(url: str) -> AsyncIterator[Driver]:
    async with open_driver(url) as opened:
        yield opened


async def test_a_sigterm_during_start_up_ends_the_worker_cleanly(url: str, tmp_path: Path) -> None:
    # The application takes 3 s to import; SIGTERM comes in its first second, before the
    # lifecycle could listen. It used to kill the process (-15) with nothing in its log.
    async with workers(tmp_path, url, 1, env={"EDGES_IMPORT_SECONDS": "3"}) as [worker]:
        await trio.sleep(0.5)
        worker.signal(signal.SIGTERM)
        code = await worker.exit_code(within=30)
    assert code == 0, worker.output()
    assert "jobs.worker.stopped-at-start" in worker.output()


async def running_count(driver: Driver, job_ids: list[str]) -> int:
    states = [(await record(driver, job_id)).state for job_id in job_ids]
    return states.count(JobState.RUNNING)


async def test_two_sigterms_5_ms_apart_cost_no_running_job_an_attempt(
    url: str, driver: Driver, tmp_path: Path
) -> None:
    # A supervisor or a wrapper that signals twice: the second cut the wait to zero before the
    # thirty hand-backs were written, and every job lost an attempt (issue 32).
    job_ids = list(await wait.enqueue_many(driver, [None] * 30))
    async with workers(tmp_path, url, 1, "--concurrency", "40") as [worker]:
        await started([worker])

        async def all_running() -> bool:
            return await running_count(driver, job_ids) == 30

        await until("the 30 bodies to run", 30, all_running)
        worker.signal(signal.SIGTERM)
        await trio.sleep(0.005)
        worker.signal(signal.SIGTERM)
        code = await worker.exit_code(within=30)
    output = worker.output()
    assert code in (0, 70), output
    for job_id in job_ids:
        r = await record(driver, job_id)
        assert (r.state, r.attempts) == (JobState.READY, 0), (job_id, output)
    assert "jobs.lifecycle.budget-cut" in output
