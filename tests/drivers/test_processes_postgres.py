# Real `jobs-trio worker` processes on one PostgreSQL database: four workers share 10,000 jobs
# without a job lost or run twice; SIGTERM drains (interrupted, attempt handed back, exit 0) and
# another process finishes the job; a SIGKILLed worker's job is re-claimed after its lease; and
# a worker whose every connection is killed reconnects and loses nothing. The jobs are
# tests/apps/postgres_app. Each test runs in a database of its own, dropped at the end: the
# worker command opens the default schema (it has no --schema), so isolation is per database.
from __future__ import annotations

import functools
import signal
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from urllib.parse import urlparse

import pytest
import trio

from jobs_trio._core.records import JobState
from jobs_trio.driver import Driver
from jobs_trio.drivers._open_driver import open_driver
from tests.apps.postgres_app import registry
from tests.drivers.test_postgres_driver import Admin, open_admin
from tests.helpers.process_helpers import (
    WorkerProcess,
    assert_drained,
    record,
    started,
    until,
    worker_processes,
)

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

APP = "tests.apps.postgres_app"
workers = functools.partial(worker_processes, APP)
# What the driver names its connections on the server: jobs_trio:<schema>:pool / :listen.
DRIVER_BACKENDS = "jobs_trio:%"


@asynccontextmanager
async def fresh_database(server: str) -> AsyncIterator[str]:
    """The URL of a new database on ``server`` holding a freshly migrated jobs_trio schema; the
    database (schema and all) is dropped on the way out, whatever happened, with its sessions."""
    name = f"jt_{uuid.uuid4().hex[:12]}"
    async with open_admin(server) as admin:
        await admin.execute(f'CREATE DATABASE "{name}"')
        try:
            url = urlparse(server)._replace(path=f"/{name}").geturl()
            # The schema exists before any worker process opens the database (they do not
            # migrate on their own).
            async with open_driver(url, migrate=True):
                pass
            yield url
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(30):
                await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def kill_driver_backends(admin: Admin) -> list[str]:
    """``pg_terminate_backend`` every jobs_trio connection to the admin's database (the admin's
    own is not one: asyncpg names none); answers their application names. MATERIALIZED so
    the terminate runs only on rows the filter kept, never on another database's sessions."""
    names: list[str] | None = await admin.fetchval(
        """
        WITH doomed AS MATERIALIZED (
            SELECT pid, application_name FROM pg_stat_activity
            WHERE datname = current_database() AND application_name LIKE $1
              AND pid <> pg_backend_pid()
        )
        SELECT array_agg(application_name ORDER BY application_name) FROM doomed
        WHERE pg_terminate_backend(pid)
        """,
        DRIVER_BACKENDS,
    )
    return names or []


def lines_of(seen: Path) -> list[list[str]]:
    """The bodies' own record: one "<job id> <worker id>" line per run."""
    if not seen.exists():
        return []
    return [line.split() for line in seen.read_text().splitlines()]


def assert_each_ran_once(seen: Path, ids: list[str]) -> list[list[str]]:
    lines = lines_of(seen)
    ran = [job_id for job_id, _ in lines]
    assert len(set(ran)) == len(ran), f"{len(ran) - len(set(ran))} runs were a job's second"
    assert set(ran) == set(ids), f"{len(set(ids) - set(ran))} jobs never ran"
    return lines


async def completed_in(driver: Driver, queue: str) -> int:
    for stats in await driver.stats():
        if stats.queue == queue:
            return stats.depth.get(JobState.COMPLETED.value, 0)
    return 0


async def body_started(driver: Driver, job_id: str) -> None:
    """Until the hang job's body has recorded its first step: it is running, in a worker."""

    async def entered() -> bool:
        return bool(await driver.load_steps(job_id))

    await until("the job's body to start", 20, entered)


async def completed_by_the_second(driver: Driver, job_id: str) -> None:
    async def completed() -> bool:
        return (await record(driver, job_id)).state is JobState.COMPLETED

    await until("the second worker to complete the job", 20, completed)


def still_running(worker: WorkerProcess) -> bool:
    """True while ``worker`` runs; a failure with its log once it has exited."""
    if worker.process.returncode is not None:
        pytest.fail(f"the worker exited ({worker.process.returncode}):\n{worker.output()[-6000:]}")
    return True


async def stop(processes: list[WorkerProcess], within: float = 15.0) -> None:
    """SIGTERM each process; each must exit 0 (a drain, not a crash) within ``within``."""
    for proc in processes:
        proc.signal(signal.SIGTERM)
    for proc in processes:
        assert await proc.exit_code(within=within) == 0, proc.output()


async def test_four_processes_run_10000_jobs_each_exactly_once(
    tmp_path: Path, postgres_url: str
) -> None:
    seen = tmp_path / "seen.txt"
    count = 10_000
    async with (
        fresh_database(postgres_url) as url,
        workers(tmp_path, url, 4, "--concurrency", "50") as procs,
    ):
        await started(procs)
        async with open_driver(url) as driver:
            began = trio.current_time()
            ids = await registry.require("app.record").enqueue_many(
                driver, [{"seen": str(seen)}] * count
            )

            async def all_completed() -> bool:
                return await completed_in(driver, "bulk") == count

            await until(f"{count:,} jobs completed", 60, all_completed)
            took = trio.current_time() - began
            await stop(procs)
            [bulk] = [s for s in await driver.stats() if s.queue == "bulk"]
            assert bulk.depth == {JobState.COMPLETED.value: count}
    print(f"\n{count} jobs on 4 processes: {took:.1f} s from enqueue, {count / took:.0f} jobs/s")
    lines = assert_each_ran_once(seen, ids)
    # Every process took part: four workers sharing one database, not one doing it all.
    assert len({worker for _, worker in lines}) == 4


async def test_sigterm_interrupts_a_running_job_and_another_process_finishes_it(
    tmp_path: Path, postgres_url: str
) -> None:
    grace = 25.0
    async with fresh_database(postgres_url) as url, open_driver(url) as driver:
        job_id = await registry.require("app.hang").enqueue(driver, {"seconds": 60})

        async with workers(tmp_path, url, 1, "--grace", str(grace)) as [first]:
            await body_started(driver, job_id)
            signalled = trio.current_time()
            first.signal(signal.SIGTERM)
            code = await first.exit_code(within=grace + 5)
            took = trio.current_time() - signalled
            assert code == 0, first.output()
        print(f"\nexit {took:.2f} s after SIGTERM (grace {grace:.0f} s)")
        # The body hears the drain at once; nothing waits out the grace period (half of it: the
        # exit takes about a second, and a loaded machine adds a few).
        assert took < grace / 2, f"exit took {took:.1f} s\n{first.output()}"
        await assert_drained(driver, job_id, first)

        async with workers(tmp_path, url, 1) as [second]:
            await completed_by_the_second(driver, job_id)
            await stop([second])
        done = await record(driver, job_id)
        # The drained run handed its attempt back: the second run was the first counted.
        assert done.attempts == 1
        assert done.result == {"attempt": 1}


async def test_a_sigkilled_workers_job_is_claimed_after_its_lease_orphaned_its_attempt_not_counted(
    tmp_path: Path, postgres_url: str
) -> None:
    lease = 2.0
    async with fresh_database(postgres_url) as url, open_driver(url) as driver:
        job_id = await registry.require("app.hang").enqueue(driver, {"seconds": 60})

        async with workers(tmp_path, url, 1, "--lease", str(lease)) as [first]:
            await body_started(driver, job_id)
            first.signal(signal.SIGKILL)
            killed_at = trio.current_time()
            assert await first.exit_code(within=10) == -signal.SIGKILL
        killed = await record(driver, job_id)
        assert (killed.state, killed.attempts) == (JobState.RUNNING, 1)

        async with workers(tmp_path, url, 1, "--lease", str(lease)) as [second]:
            # The first claim's lease lapses, then the second worker's next look claims it.
            await completed_by_the_second(driver, job_id)
            rerun = trio.current_time() - killed_at
            await stop([second])
        print(f"\nre-run complete {rerun:.2f} s after SIGKILL (lease {lease:.0f} s)")
        done = await record(driver, job_id)
        # Its worker died under it: orphaned (docs/model.md, "A worker's death"), the killed
        # run's attempt handed back, so the second run was attempt 1 again.
        assert (done.attempts, done.orphans) == (1, 1)
        assert done.result == {"attempt": 1}


async def test_connections_killed_under_a_running_worker_lose_no_job(
    tmp_path: Path, postgres_url: str
) -> None:
    seen = tmp_path / "seen.txt"
    count = 2_000
    kill_at = (400, 1_100)  # completed runs before each kill: mid-stream, well apart
    async with fresh_database(postgres_url) as url:
        async with open_driver(url) as driver:
            # 2,000 jobs of 50 ms at concurrency 20: a stream of at least 5 s to disturb.
            ids = await registry.require("app.record").enqueue_many(
                driver, [{"seen": str(seen), "pause": 0.05}] * count
            )
        # From here the test's only connection is the admin's, so every jobs_trio backend on
        # this database is the worker's. Progress is read off the bodies' own record.
        async with (
            open_admin(url) as admin,
            workers(tmp_path, url, 1, "--concurrency", "20", "--lease", "10") as [worker],
        ):
            await started([worker])
            for round_, at in enumerate(kill_at, start=1):

                async def reached(at: int = at) -> bool:
                    return still_running(worker) and len(lines_of(seen)) >= at

                await until(f"{at} jobs run", 30, reached)
                killed = await kill_driver_backends(admin)
                print(f"\nkill {round_} at {len(lines_of(seen))} runs: {killed}")
                # The pool's and the LISTEN connection both went.
                assert {name.rsplit(":", 1)[1] for name in killed} == {"pool", "listen"}, killed

                async def reconnected(round_: int = round_) -> bool:
                    log = worker.output()
                    return still_running(worker) and log.count("jobs.driver.reconnected") >= round_

                await until(f"the worker to log reconnect {round_}", 20, reconnected)

            async def all_ran() -> bool:
                return still_running(worker) and len(lines_of(seen)) >= count

            await until(f"all {count:,} jobs run", 60, all_ran)
            # Runs are recorded before they are settled: wait for the settles too.
            async with open_driver(url) as driver:

                async def all_completed() -> bool:
                    return await completed_in(driver, "bulk") == count

                await until(f"{count:,} jobs completed", 30, all_completed)
            await stop([worker])
        log = worker.output()
        print(
            "worker log:",
            {
                event: log.count(event)
                for event in (
                    "jobs.driver.reconnect ",
                    "jobs.driver.reconnected",
                    "jobs.worker.claim-failed",
                    "jobs.settle.retrying",
                    "jobs.lease.renew-failed",
                    "jobs.attempt.retried",
                    "Traceback",
                )
            },
        )
        assert_each_ran_once(seen, ids)
        async with open_driver(url) as driver:
            done = await driver.list_jobs(state=JobState.COMPLETED, limit=count + 1)
            assert len(done) == count
            recounted = [job for job in done if job.attempts != 1]
            print(f"completed with attempts != 1: {[(j.id, j.attempts) for j in recounted]}")


async def test_a_worker_whose_connections_stop_answering_moves_to_new_ones(
    tmp_path: Path, postgres_url: str
) -> None:
    # Every connection the worker has open stops answering (a proxy freezes them: a failover
    # that moved the address), while new ones pass. The server never hears those statements,
    # so its statement_timeout never fires: the worker ran nothing for as long as a review
    # watched (60 s) and logged nothing. Each operation is now bounded by statement_timeout
    # (1 s here) and a margin (10 s), after which its connection is dropped.
    from tests.drivers.test_postgres_driver import freezable

    seen = tmp_path / "seen.txt"
    count = 1_000
    async with fresh_database(postgres_url) as url, freezable(url) as (proxied, freeze):
        async with open_driver(url) as driver:
            ids = await registry.require("app.record").enqueue_many(
                driver, [{"seen": str(seen), "pause": 0.02}] * count
            )
        through = proxied + "&statement_timeout=1s"
        async with workers(tmp_path, through, 1, "--concurrency", "10") as [worker]:

            async def some_ran() -> bool:
                return still_running(worker) and len(lines_of(seen)) >= 100

            await until("100 jobs run", 30, some_ran)
            freeze()
            async with open_driver(url) as driver:

                async def all_completed() -> bool:
                    return still_running(worker) and await completed_in(driver, "bulk") == count

                await until(
                    f"all {count:,} jobs completed past the frozen connections", 90, (all_completed)
                )
            await stop([worker])
        assert "no answer from PostgreSQL" in worker.output(), worker.output()[-3000:]
    ran = {job_id for job_id, _ in lines_of(seen)}
    assert ran == set(ids)  # at least once each (a frozen claim's jobs ran after their lapse)
