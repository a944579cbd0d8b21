# A SQLite database file replaced (a restore, a deploy that copies one in) or deleted under a
# running driver or producer: SQLite in WAL mode goes on writing to the unlinked file, so each
# write after was answered as done and lost. Refused or reopened, never written there.
from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import trio

import jobs_trio
from jobs_trio import ConfigError, JobState
from jobs_trio.sync import Producer
from tests.apps.producer_app import blocking, elsewhere, welcome
from tests.helpers.app_process import ROOT, wait_until
from tests.helpers.process_helpers import worker_processes


async def migrated(path: Path) -> str:
    url = f"sqlite:///{path}"
    async with jobs_trio.open_driver(url, migrate=True):
        pass
    return url


async def replaced(path: Path) -> None:
    """Another jobs_trio database moved in at ``path`` (its old WAL and shm go with the old
    file, as a restore that replaces all three would leave it)."""
    other = path.with_name("other.db")
    await migrated(other)
    for suffix in ("-wal", "-shm"):
        with_suffix = Path(f"{path}{suffix}")
        if with_suffix.exists():
            with_suffix.unlink()
    os.replace(other, path)


def gone(path: Path) -> None:
    for name in (str(path), f"{path}-wal", f"{path}-shm"):
        if os.path.exists(name):
            os.unlink(name)


@pytest.mark.parametrize("how", ["replaced", "deleted"])
async def test_a_driver_refuses_to_write_once_its_file_is_not_at_its_path(
    tmp_path: Path, how: str
) -> None:
    path = tmp_path / "jobs.db"
    url = await migrated(path)
    async with jobs_trio.open_driver(url) as driver:
        first = await welcome.enqueue(driver, {"to": "before"})
        await (replaced(path) if how == "replaced" else trio.to_thread.run_sync(gone, path))
        with pytest.raises(ConfigError, match="replaced or deleted after this process opened"):
            await welcome.enqueue(driver, {"to": "after"})
        # A read (and the idle worker's look for new work) too: it would answer the old file.
        with pytest.raises(ConfigError, match="replaced or deleted"):
            await driver.get(first)
    if how == "replaced":
        async with jobs_trio.open_driver(url) as fresh:
            assert await fresh.get(first) is None  # the new file, untouched
            assert await fresh.list_jobs() == []


async def test_a_producer_writes_its_job_into_the_file_now_at_its_path(tmp_path: Path) -> None:
    """Before: the kept connection wrote into the unlinked file, and the id answered named a
    job no one would ever see."""
    path = tmp_path / "jobs.db"
    url = await migrated(path)
    with Producer(url) as producer:
        producer.enqueue(welcome, {"to": "before"})  # its connection kept for the next call
        await replaced(path)
        after = producer.enqueue(welcome, {"to": "after"})
        async with jobs_trio.open_driver(url) as driver:
            assert [job.id for job in await driver.list_jobs()] == [after]
        await trio.to_thread.run_sync(gone, path)
        with pytest.raises(ConfigError, match="not a jobs_trio database"):
            producer.enqueue(welcome, {"to": "nowhere"})
        assert not path.exists()  # a producer never creates one
        path.write_bytes(b"")  # and whatever comes in next is checked too
        with pytest.raises(ConfigError, match="not a jobs_trio database"):
            producer.enqueue(welcome, {"to": "nowhere"})


@pytest.mark.slow
async def test_a_worker_whose_file_is_replaced_stops_and_says_why(tmp_path: Path) -> None:
    """Before, an idle worker looked at the old file for ever, and never ran the new one's
    jobs; a busy one wrote its claims and results there."""
    path = tmp_path / "jobs.db"
    url = await migrated(path)
    async with worker_processes("tests.apps.producer_app", tmp_path, url, 1) as [worker]:
        async with jobs_trio.open_driver(url) as driver:
            first = await welcome.enqueue(driver, {"to": "first"})

            async def ran() -> bool:
                job = await driver.get(first)
                return job is not None and job.state is JobState.COMPLETED

            await wait_until("the first job to run", 30, ran)
        await replaced(path)
        assert await worker.exit_code(within=30) != 0
    assert "replaced or deleted after this process opened it" in worker.output()


@pytest.mark.slow
async def test_a_worker_whose_file_is_replaced_names_the_result_it_could_not_write(
    tmp_path: Path,
) -> None:
    """The body finished after the file was replaced: its result cannot be written anywhere
    anyone reads. Before, the worker logged the attempt completed, stopped with abandoned=0
    and exited with no word of the result it dropped."""
    path = tmp_path / "jobs.db"
    url = await migrated(path)
    async with worker_processes("tests.apps.producer_app", tmp_path, url, 1) as [worker]:
        async with jobs_trio.open_driver(url) as driver:
            job_id = await blocking.enqueue(driver, {"s": 2.0})

            async def running() -> bool:
                job = await driver.get(job_id)
                return job is not None and job.state is JobState.RUNNING

            await wait_until("the job to start", 30, running)
        await replaced(path)  # while its body holds the loop
        assert await worker.exit_code(within=60) != 0
    log = worker.output()
    assert "jobs.attempt.completed" in log and "jobs.worker.settle-abandoned" in log
    [line] = [x for x in log.splitlines() if "jobs.worker.settle-abandoned" in x]
    assert f"job_id={job_id}" in line


async def test_a_path_through_a_symlink_and_dot_dot_is_checked_as_sqlite_opened_it(
    tmp_path: Path,
) -> None:
    """``app/data/../jobs.db`` with ``data`` a link to ``vol/sub`` is ``vol/jobs.db`` to the
    kernel and to SQLite, and ``app/jobs.db`` to a normalised path: the file SQLite wrote was
    deleted, and the check looked at one that was never there."""
    (tmp_path / "vol" / "sub").mkdir(parents=True)
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "data").symlink_to(tmp_path / "vol" / "sub")
    url = await migrated(tmp_path / "app" / "data" / ".." / "jobs.db")
    assert (tmp_path / "vol" / "jobs.db").exists()
    async with jobs_trio.open_driver(url) as driver:
        await welcome.enqueue(driver, {"to": "before"})
        await trio.to_thread.run_sync(gone, tmp_path / "vol" / "jobs.db")
        with pytest.raises(ConfigError, match="replaced or deleted"):
            await welcome.enqueue(driver, {"to": "after"})


@pytest.mark.slow
async def test_a_body_that_moves_the_working_directory_keeps_its_lease_renewed(
    tmp_path: Path,
) -> None:
    """A worker on a relative path whose body calls os.chdir and then holds the loop: the
    lease lifeline opened its connection by the relative path after the chdir, found no
    database, and renewed nothing."""
    path = tmp_path / "jobs.db"
    await migrated(path)
    relative = f"sqlite:///{os.path.relpath(path, ROOT)}"
    async with worker_processes("tests.apps.producer_app", tmp_path, relative, 1) as [worker]:
        async with jobs_trio.open_driver(f"sqlite:///{path}") as driver:
            job_id = await elsewhere.enqueue(driver, {"s": 2.5})

            async def done() -> bool:
                job = await driver.get(job_id)
                return job is not None and job.state is JobState.COMPLETED

            await wait_until("the job to complete", 60, done)
        worker.signal(signal.SIGTERM)
        assert await worker.exit_code(within=60) == 0
    log = worker.output()
    assert 'leases="renewed beside the loop"' in log
    assert "jobs.lease.renew-failed" not in log, log
