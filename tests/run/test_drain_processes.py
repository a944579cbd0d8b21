# The drain end to end, in real `jobs-trio worker` processes on SQLite and on PostgreSQL (issue
# 11): (a) a body that returns in a shield after SIGTERM completes; (b) a sync body is waited for,
# not handed to the replacement worker started at the SIGTERM; (c) past the grace it is
# abandoned, never `ready` while it runs, and runs again only after its lease lapses (and a
# suspect so abandoned is orphaned, not dead-lettered); (d) with the database stalled, the
# process is still gone within its grace.
from __future__ import annotations

import functools
import signal
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

from jobs_trio._core.records import JobState
from jobs_trio.drivers._open_driver import open_driver
from jobs_trio.drivers._rules import ORPHANED_ERROR, SUSPECT_AT
from tests.apps.drain_jobs_app import registry
from tests.helpers.process_helpers import LOADED, WorkerProcess, record, until, worker_processes

pytestmark = pytest.mark.slow

workers = functools.partial(worker_processes, "tests.apps.drain_jobs_app")


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def database(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    """The URL of a fresh, migrated database of either kind."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'jobs.db'}"
        async with open_driver(url):  # the schema exists before any worker opens the file
            pass
        yield url
        return
    from tests.conftest import require_postgres
    from tests.drivers.test_processes_postgres import fresh_database

    async with fresh_database(require_postgres()) as url:
        yield url


def marks(path: Path, event: str) -> list[list[str]]:
    """The lines ``event job_id worker_id time`` the bodies wrote for ``event``."""
    if not path.exists():
        return []
    lines = [line.split() for line in path.read_text().splitlines()]
    return [line for line in lines if line[0] == event]


async def body_started(path: Path, count: int = 1) -> None:
    async def entered() -> bool:
        return len(marks(path, "start")) >= count

    await until(f"{count} body start(s) in {path.name}", 30, entered)


async def exit_after_sigterm(worker: WorkerProcess, within: float) -> tuple[int, float]:
    sent = trio.current_time()
    worker.signal(signal.SIGTERM)
    code = await worker.exit_code(within=within)
    return code, trio.current_time() - sent


async def test_a_body_that_returns_in_a_shield_after_sigterm_completes(
    tmp_path: Path, database: str
) -> None:
    path = tmp_path / "marks.txt"
    async with open_driver(database) as driver:
        job_id = await registry.require("drain.finish").enqueue(driver, {"marks": str(path)})
        async with workers(tmp_path, database, 1, "--grace", "10") as [worker]:
            await body_started(path)
            code, took = await exit_after_sigterm(worker, within=15)
            assert code == 0, worker.output()
        done = await record(driver, job_id)
    print(f"\nexit {code} {took:.2f} s after SIGTERM; the body returned 1 s after it")
    # The body's second, and the exit; waiting out the grace (10 s) is the failure.
    assert 1 <= took < 1 + 2 + LOADED, f"{took:.2f} s\n{worker.output()}"
    assert (done.state, done.attempts) == (JobState.COMPLETED, 1), worker.output()
    assert done.result is not None
    assert done.result == {"done": True, "reason": "X_DRAINING"}


async def test_a_sync_body_is_waited_for_and_runs_once_beside_the_replacement_worker(
    tmp_path: Path, database: str
) -> None:
    path = tmp_path / "marks.txt"
    async with open_driver(database) as driver:
        job_id = await registry.require("drain.crunch").enqueue(
            driver, {"marks": str(path), "seconds": 1.5}
        )
        async with workers(tmp_path, database, 1, "--grace", "10") as [first]:
            await body_started(path)
            # A deploy: the replacement starts as the old worker is told to stop.
            async with workers(tmp_path, database, 1) as [replacement]:
                code, took = await exit_after_sigterm(first, within=15)
                assert code == 0, first.output()
                done = await record(driver, job_id)
                # The replacement had every chance to claim it while the first drained.
                replacement.signal(signal.SIGTERM)
                assert await replacement.exit_code(within=15) == 0, replacement.output()
    print(f"\nexit {code} {took:.2f} s after SIGTERM; 1.5 s body, {len(marks(path, 'start'))} run")
    assert (done.state, done.attempts) == (JobState.COMPLETED, 1), first.output()
    assert len(marks(path, "start")) == 1, path.read_text()  # the body ran once
    assert took >= 1.0, "the first worker did not wait for its thread"


async def test_a_sync_body_past_the_grace_is_abandoned_and_rerun_only_after_its_lease(
    tmp_path: Path, database: str
) -> None:
    path = tmp_path / "marks.txt"
    lease = 3.0
    async with open_driver(database) as driver:
        job_id = await registry.require("drain.crunch").enqueue(
            driver, {"marks": str(path), "seconds": 5}
        )
        options = ("--grace", "1", "--lease", str(lease))
        async with workers(tmp_path, database, 1, *options) as [first]:
            await body_started(path)
            async with workers(tmp_path, database, 1, *options) as [replacement]:
                first.signal(signal.SIGTERM)
                # Never `ready` while the first process's thread still runs it.
                while first.process.returncode is None:
                    held = await record(driver, job_id)
                    assert held.state is JobState.RUNNING, held
                    await trio.sleep(0.05)
                assert first.process.returncode not in (0, None), first.output()
                assert "jobs.worker.drain-abandoned" in first.output()
                assert job_id in first.output()
                lapses_at = (await record(driver, job_id)).lease_until
                assert lapses_at is not None

                async def completed() -> bool:
                    return (await record(driver, job_id)).state is JobState.COMPLETED

                await until("the replacement to run it again", 30, completed)
                replacement.signal(signal.SIGTERM)
                await replacement.exit_code(within=15)
        done = await record(driver, job_id)
    starts = marks(path, "start")
    print(
        f"\nexit {first.process.returncode}; second run started "
        f"{float(starts[1][3]) - lapses_at:+.2f} s from the abandoned lease's end"
    )
    assert [line[2] for line in starts] == [line[2] for line in starts[:1]] + [
        replacement_id(replacement)
    ], path.read_text()
    # Run again only once the abandoned claim's lease had lapsed (at-least-once).
    assert float(starts[1][3]) >= lapses_at - 0.05, (starts, lapses_at)
    # Its lease lapsed with the process that abandoned it: orphaned, the attempt handed back
    # (docs/model.md, "A worker's death"), so the second run was attempt 1 again.
    assert (done.attempts, done.orphans, done.result) == (1, 1, {"attempt": 1})


async def test_a_suspect_abandoned_past_the_grace_is_orphaned_not_dead_lettered(
    tmp_path: Path, database: str
) -> None:
    # A job orphaned twice runs alone; its body ignores the drain past a grace of 3 s (past the
    # writes' floor: bodies and writes would be cut at once but for the reserve a worker holding
    # a suspect keeps). The deploy, not the job, ended that worker: orphaned, not X_KILLED_WORKER.
    path = tmp_path / "marks.txt"
    async with open_driver(database) as driver:
        job_id = await registry.require("drain.crunch").enqueue(
            driver, {"marks": str(path), "seconds": 10}
        )
        for dies in range(SUSPECT_AT):  # two workers die under it (their leases lapse)
            await driver.claim(["crunch"], 1, lease=0.2, worker_id=f"dies-{dies}")

            async def lapsed() -> bool:
                held = await record(driver, job_id)
                return held.lease_until is not None and held.lease_until < driver.now()

            await until("the lease to lapse", 10, lapsed)
        assert await driver.claim(["crunch"], 1, lease=3, worker_id="busy") == []
        assert (await record(driver, job_id)).orphans == SUSPECT_AT
        async with workers(tmp_path, database, 1, "--grace", "3", "--lease", "3") as [worker]:
            await body_started(path)
            code, took = await exit_after_sigterm(worker, within=15)
        assert code == 70, worker.output()
        assert "jobs.worker.drain-abandoned" in worker.output()
        assert "alone-unmark-failed" not in worker.output()
        assert took < 3 + 1.0 + LOADED, f"{took:.2f} s\n{worker.output()}"
        held = await record(driver, job_id)
        assert held.state is JobState.RUNNING  # its lease still lapses as any
        lapses_at = held.lease_until
        assert lapses_at is not None

        async def past_its_lease() -> bool:
            return driver.now() > lapses_at

        await until("the abandoned lease to lapse", 10, past_its_lease)
        assert await driver.claim(["crunch"], 1, lease=3, worker_id="next") == []
        after = await record(driver, job_id)
    print(f"\nexit {code} {took:.2f} s after SIGTERM (grace 3): {after.state}, {after.orphans}")
    assert (after.state, after.attempts, after.orphans) == (JobState.READY, 0, SUSPECT_AT + 1)
    assert after.last_error == ORPHANED_ERROR.format(orphans=SUSPECT_AT + 1)


def replacement_id(worker: WorkerProcess) -> str:
    [line] = [ln for ln in worker.output().splitlines() if "jobs.worker.started" in ln]
    return line.split(" worker=")[1].split()[0]


async def test_with_the_database_stalled_the_process_is_gone_within_its_grace(
    tmp_path: Path, database: str
) -> None:
    path = tmp_path / "marks.txt"
    grace = 2.0
    async with open_driver(database) as driver:
        await registry.require("drain.wait").enqueue(driver, {"marks": str(path)})
        async with workers(tmp_path, database, 1, "--grace", str(grace)) as [worker]:
            await body_started(path)
            async with stalled(database) as stall:
                await stall.a_claim_waits()
                code, took = await exit_after_sigterm(worker, within=30)
    print(f"\nexit {code} {took:.2f} s after SIGTERM with the database stalled (grace {grace})")
    assert took < grace + 1.0 + LOADED, f"{took:.2f} s\n{worker.output()}"


class stalled:
    """Every write to the jobs table blocks while the block runs: SQLite's write lock held by
    another connection, or PostgreSQL's jobs table locked ACCESS EXCLUSIVE by an admin."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._sqlite: sqlite3.Connection | None = None
        self._admin_cm: object = None

    async def a_claim_waits(self) -> None:
        """Return once the worker's claim loop has a claim in flight, blocked on the lock."""
        if self._sqlite is not None:
            # SQLite shows no waiting writer: wait out the worker's poll interval (1 s), after
            # which its next claim is blocked on the lock.
            await trio.sleep(1.5)
            return

        async def waiting() -> bool:
            count = await self._admin.fetchval_now(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock' AND application_name LIKE 'jobs_trio:%'"
            )
            return bool(count)

        await until("a worker statement waiting on the stalled table", 10, waiting)

    async def __aenter__(self) -> stalled:
        if self.url.startswith("sqlite:///"):
            path = self.url.removeprefix("sqlite:///")

            def lock() -> sqlite3.Connection:
                conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
                conn.execute("BEGIN EXCLUSIVE")
                return conn

            self._sqlite = await trio.to_thread.run_sync(lock)
            return self
        from tests.drivers.test_postgres_driver import open_admin

        self._admin_cm = open_admin(self.url)
        admin = await self._admin_cm.__aenter__()  # type: ignore[attr-defined]
        self._admin = admin
        await admin.execute("BEGIN")
        await admin.execute("LOCK TABLE jobs_trio.jobs IN ACCESS EXCLUSIVE MODE")
        return self

    async def __aexit__(self, *exc: object) -> None:
        with trio.CancelScope(shield=True):
            if self._sqlite is not None:
                conn = self._sqlite

                def unlock() -> None:
                    conn.rollback()
                    conn.close()

                await trio.to_thread.run_sync(unlock)
                return
            await self._admin.execute("ROLLBACK")
            await self._admin_cm.__aexit__(None, None, None)  # type: ignore[attr-defined]
