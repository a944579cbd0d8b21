# A migration behind a long reader on PostgreSQL (issue 49): it waits for its locks in short
# tries, naming the reader each time, and the fleet does not wait with it: a worker and an
# enqueuer running meanwhile lose nothing, run nothing twice and are charged no attempt. And a
# statement that does wait out its lock timeout says what held the lock. The reader holds its
# transaction for READER_SECONDS (the 20 s: JOBS_TRIO_READER_SECONDS=20).
from __future__ import annotations

import collections
import logging
import os
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import pytest
import trio

import jobs_trio
from jobs_trio._core.errors import JobsError, RowLocked
from jobs_trio._core.records import JobState
from jobs_trio.drivers._migration_files import Migration
from jobs_trio.testing.conformance.helpers import new_job
from tests.conftest import require_postgres

pytestmark = pytest.mark.postgres

pytest.importorskip("trio_asyncio")
pytest.importorskip("asyncpg")

from jobs_trio.drivers._postgres_migrate import MIGRATION_LOCK_TIMEOUT, apply_migrations  # noqa: E402
from jobs_trio.drivers.postgres import PostgresDriver, open_postgres_driver  # noqa: E402
from tests.drivers.test_postgres_driver import Admin, open_admin  # noqa: E402

# Past the driver's lock timeout (POOL_LOCK_TIMEOUT): a migration that queued behind the
# reader without a bound would fail every statement of the fleet that queued behind it.
READER_SECONDS = float(os.environ.get("JOBS_TRIO_READER_SECONDS", "2.5"))
POOL_LOCK_TIMEOUT = 1.5
ENQUEUE_EVERY = 0.02


@attrs.define
class Fleet:
    """What the worker and the enqueuer did while the migration waited."""

    runs: collections.Counter[str] = attrs.field(factory=collections.Counter)
    done_at: dict[str, float] = attrs.field(factory=dict)
    enqueued: list[str] = attrs.field(factory=list)
    sent_at: list[float] = attrs.field(factory=list)
    enqueue_seconds: list[float] = attrs.field(factory=list)
    failed: list[JobsError] = attrs.field(factory=list)

    def registry(self) -> tuple[jobs_trio.Registry, Any]:
        """The worker's registry and its one job, which counts its runs."""
        registry = jobs_trio.Registry()

        @registry.job("fleet.work", attempts=1)  # a second attempt charged would dead-letter it
        async def work(ctx: jobs_trio.JobContext, payload: dict[str, Any]) -> None:
            self.runs[ctx.job_id] += 1
            await trio.sleep(0.01)
            self.done_at[ctx.job_id] = trio.current_time()

        return registry, work

    async def enqueue_until(self, stop: trio.Event, enqueue: Callable[[], Awaitable[str]]) -> None:
        """The application: an enqueue every ENQUEUE_EVERY seconds until ``stop``, stopped
        between two enqueues, never inside one (a cut enqueue may have committed)."""
        while not stop.is_set():
            sent = trio.current_time()
            try:
                self.enqueued.append(await enqueue())
            except JobsError as exc:
                self.failed.append(exc)
            self.sent_at.append(sent)
            self.enqueue_seconds.append(trio.current_time() - sent)
            await trio.sleep(ENQUEUE_EVERY)


def next_release(driver: PostgresDriver) -> Any:
    """The driver's statements with one more migration: the next release's column on jobs,
    which needs the table's exclusive lock."""
    sql = driver._sql
    column = Migration(
        9001, "9001_next_note.sql", f'ALTER TABLE "{sql.schema}".jobs ADD COLUMN note text'
    )
    return attrs.evolve(sql, migrations=[*sql.migrations, column])


async def hold_a_reader(
    admin: Admin, schema: str, opened: trio.Event, seconds: float, blocked: Callable[[], bool]
) -> None:
    """A report's transaction: it read the jobs table, and holds its lock until it ends, after
    ``seconds`` and once the migration gave way to it (a loaded machine's migration may take
    that long to reach the table)."""
    await admin.execute("SET application_name = 'nightly-report'")
    await admin.execute("BEGIN")
    await admin.fetchval(f'SELECT count(*) FROM "{schema}".jobs')
    opened.set()
    await trio.sleep(seconds)
    with trio.fail_after(60):
        while not blocked():
            await trio.sleep(0.05)
    await admin.execute("COMMIT")


def blocked_tries(caplog: pytest.LogCaptureFixture) -> list[Any]:
    """The fields of each jobs.migrate.blocked line logged so far."""
    return [
        r.fields  # type: ignore[attr-defined]
        for r in caplog.records
        if getattr(r, "event", "") == "jobs.migrate.blocked"
    ]


async def test_a_migration_behind_a_long_reader_waits_and_the_fleet_does_not(
    pg_schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    url = require_postgres()
    fleet = Fleet()
    registry, work = fleet.registry()
    caplog.set_level(logging.INFO, logger="jobs_trio")
    async with (
        open_postgres_driver(
            url,
            schema=pg_schema,
            migrate=True,
            drop_schema_on_close=True,
            lock_timeout=POOL_LOCK_TIMEOUT,
        ) as driver,
        open_admin(url) as admin,
        jobs_trio.open_worker(driver, registry, lifecycle=None, poll_interval=0.05),
    ):
        reader_pid = await admin.fetchval("SELECT pg_backend_pid()")
        stop = trio.Event()
        opened = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(fleet.enqueue_until, stop, lambda: work.enqueue(driver, {}))
            nursery.start_soon(
                hold_a_reader,
                admin,
                driver.schema,
                opened,
                READER_SECONDS,
                lambda: bool(blocked_tries(caplog)),
            )
            await opened.wait()
            started = trio.current_time()
            applied = await apply_migrations(driver.bridge, next_release(driver))
            migrated = trio.current_time()
            # Enqueued after the migration: the fleet runs on against the new column.
            await trio.sleep(0.2)
            stop.set()
        # Until every job's settlement is written, not only its body done: the settler writes
        # after the body returns, and on a loaded machine the last one's write came after the
        # read below (a job read as running, CI beside two reviews' suites).
        with trio.fail_after(30):
            while True:
                records = [await driver.get(job_id) for job_id in fleet.enqueued]
                waiting = (JobState.READY, JobState.RUNNING)
                if all(r is not None and r.state not in waiting for r in records):
                    break
                await trio.sleep(0.05)

    assert applied == [9001]
    # The migration waited for the reader...
    assert migrated - started >= READER_SECONDS - 0.2
    # ...while the fleet did not: nothing failed, every job ran once, none was charged twice.
    assert fleet.failed == []
    assert set(fleet.runs.values()) == {1} and set(fleet.runs) == set(fleet.enqueued)
    assert all(r is not None and r.state is JobState.COMPLETED for r in records)
    assert all(r is not None and r.attempts == 1 for r in records)
    # Each try that gave way named the reader: its pid, its application, how long it was open.
    blocked = blocked_tries(caplog)
    assert blocked
    for fields in blocked:
        # The reader first, the longest open (a statement of the fleet that began just before
        # the try's wait held it too, for a moment, and may follow).
        assert fields["pids"].split(",")[0] == str(reader_pid)
        assert f"held by pid {reader_pid} (application 'nightly-report'" in fields["held_by"]
        assert "transaction open" in fields["held_by"] and "AccessShareLock" in fields["held_by"]
        assert fields["migration"] == "migration 9001_next_note.sql"
    # No try waited longer than its lock timeout, and they came apart (backoff).
    assert len(blocked) <= READER_SECONDS / MIGRATION_LOCK_TIMEOUT
    # The figures (pytest -s), for a run with the 20 s reader.
    during = [t for t in fleet.done_at.values() if started < t < started + READER_SECONDS]
    print(
        f"\nreader {READER_SECONDS:g} s: migration took {migrated - started:.1f} s in"
        f" {len(blocked) + 1} tries; enqueues {len(fleet.enqueued)} ok, {len(fleet.failed)}"
        f" failed, slowest {max(fleet.enqueue_seconds):.2f} s; jobs run {sum(fleet.runs.values())}"
        f" for {len(fleet.runs)} jobs, {len(during)} of them finished while the reader held"
        f" (completions {len(during) / READER_SECONDS:.0f}/s); attempts charged"
        f" {sum(r.attempts for r in records if r) - len(records)} beyond one a job"
    )


async def test_a_lock_timeout_names_what_holds_the_lock(pg_schema: str) -> None:
    url = require_postgres()
    async with (
        open_postgres_driver(
            url, schema=pg_schema, migrate=True, drop_schema_on_close=True, lock_timeout=0.3
        ) as driver,
        open_admin(url) as admin,
    ):
        pid = await admin.fetchval("SELECT pg_backend_pid()")
        job_id = (await driver.enqueue([new_job()]))[0].job_id
        await admin.execute("SET application_name = 'hand-lock'")
        # A table's lock: a migration, or an operator's LOCK TABLE.
        await admin.execute("BEGIN")
        await admin.execute(f'LOCK TABLE "{pg_schema}".jobs IN ACCESS EXCLUSIVE MODE')
        with trio.fail_after(10), pytest.raises(RowLocked) as table:
            await driver.enqueue([new_job()])
        await admin.execute("ROLLBACK")
        # A row's lock: an operator's transaction holding one job.
        await admin.execute("BEGIN")
        await admin.execute(f'SELECT 1 FROM "{pg_schema}".jobs WHERE id = $1 FOR UPDATE', job_id)
        with trio.fail_after(10), pytest.raises(RowLocked) as row:
            await driver.cancel(job_id)
        await admin.execute("ROLLBACK")
    said = str(table.value)
    assert "a table that enqueue needs is locked" in said
    assert f"held by pid {pid} (application 'hand-lock'" in said
    assert "AccessExclusiveLock" in said and "transaction open" in said
    assert "retried" in table.value.fix and "the write is retried" not in said
    assert [h.pid for h in table.value.holders] == [pid]  # type: ignore[attr-defined]
    assert "a row" in str(row.value) and f"held by pid {pid}" in str(row.value)


async def test_a_migration_that_cannot_get_its_locks_gives_up_naming_the_holder(
    pg_schema: str,
) -> None:
    url = require_postgres()
    async with (
        open_postgres_driver(url, schema=pg_schema, migrate=True, drop_schema_on_close=True) as d,
        open_admin(url) as admin,
    ):
        pid = await admin.fetchval("SELECT pg_backend_pid()")
        await admin.execute("SET application_name = 'pg_dump'")
        await admin.execute("BEGIN")
        await admin.fetchval(f'SELECT count(*) FROM "{pg_schema}".jobs')
        began = trio.current_time()
        with trio.fail_after(20), pytest.raises(RowLocked) as gave_up:
            await apply_migrations(d.bridge, next_release(d), lock_timeout=0.2, wait=1.0)
        took = trio.current_time() - began
        await admin.execute("ROLLBACK")
        # Nothing of it was applied: the next try (here, at once) applies it.
        assert await apply_migrations(d.bridge, next_release(d)) == [9001]
    said = gave_up.value
    assert 1.0 <= took < 1.0 + 0.2 + 5.0  # the wait, its last try, and a loaded machine
    assert "migration 9001_next_note.sql of schema" in said.cause and "gave up" in said.cause
    assert f"held by pid {pid} (application 'pg_dump'" in said.cause
    assert "pg_terminate_backend" in said.fix and "--wait" in said.fix
