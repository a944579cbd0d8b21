# Real `jobs-trio worker` processes firing a task every second, on one SQLite file and on one
# PostgreSQL database: three workers, one SIGKILLed half-way, one started late. Each second's
# fire is read back from the jobs' payloads: every second fired, and none twice.
from __future__ import annotations

import json
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from jobs_trio.driver import Driver
from jobs_trio.drivers._open_driver import open_driver
from tests.drivers.test_processes_postgres import fresh_database
from tests.helpers.process_helpers import started, until, worker_processes

pytestmark = pytest.mark.slow

APP = "tests.apps.cron_app"
SECONDS = 10  # how many seconds of fires the test watches after the first


@asynccontextmanager
async def database(kind: str, tmp_path: Path, postgres: str | None) -> AsyncIterator[str]:
    if kind == "sqlite":
        url = f"sqlite:///{tmp_path / 'jobs.db'}"
        async with open_driver(url):  # the schema exists before three processes open the file
            pass
        yield url
    else:
        assert postgres is not None
        async with fresh_database(postgres) as url:
            yield url


async def fires(driver: Driver) -> list[float]:
    jobs = await driver.list_jobs(limit=10_000)
    return [json.loads(job.payload)["scheduled_ts"] for job in jobs if job.name == "cron.tick"]


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def test_three_workers_fire_every_second_exactly_once_through_a_kill_and_a_late_start(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    postgres = request.getfixturevalue("postgres_url") if kind == "postgres" else None
    async with (
        database(kind, tmp_path, postgres) as url,
        open_driver(url) as driver,
        worker_processes(APP, tmp_path, url, 2) as first_two,
    ):
        await started(first_two)

        async def at_least(n: int) -> bool:
            return len(await fires(driver)) >= n

        await until("the first fires", 20, lambda: at_least(1))
        origin = min(await fires(driver))
        await until("three seconds of fires", 20, lambda: at_least(3))
        async with worker_processes(APP, tmp_path, url, 1) as late:
            await started(late)
            await until("half-way", 20, lambda: at_least(SECONDS // 2))
            first_two[0].signal(signal.SIGKILL)
            assert await first_two[0].exit_code(within=10) == -signal.SIGKILL

            async def past_the_end() -> bool:
                # And the late worker has fired at least once: which worker wins a second is a
                # race, and on a loaded machine the late one can lose the first few; the test
                # is about sharing, so it watches until sharing happened (bounded).
                done = max(await fires(driver)) >= origin + SECONDS
                return done and "jobs.task.fired" in late[0].output()

            await until(f"{SECONDS} s of fires, the late worker's among them", 60, past_the_end)
            for worker in (first_two[1], late[0]):
                worker.signal(signal.SIGTERM)
            for worker in (first_two[1], late[0]):
                assert await worker.exit_code(within=15) == 0, worker.output()
        fired = sorted(await fires(driver))
    assert len(fired) == len(set(fired)), f"a second fired twice: {fired}"
    # Every second from the first fire to the last, none missing, none extra.
    span = [origin + s for s in range(round(fired[-1] - origin) + 1)]
    assert fired == span
    assert fired[-1] >= origin + SECONDS
    logs = [w.output() for w in (*first_two, *late)]
    by_worker = [log.count("jobs.task.fired") for log in logs]
    print(f"\n{kind}: {len(fired)} seconds fired once each; fires logged per worker {by_worker}")
    assert by_worker[2] > 0, "the late worker never fired: the test did not test sharing"
