# What only the SQLite driver has to show: its URL, the files it refuses (and leaves as they
# were), cancelled calls that leave the connection usable, and several connections on one file.
from __future__ import annotations

import contextlib
import json
import sqlite3
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from jobs_trio._core.errors import ConfigError, DriverError, JobsError, SchemaVersionError
from jobs_trio._core.records import Complete, JobState
from jobs_trio.driver import Driver
from jobs_trio.drivers._open_driver import open_driver
from jobs_trio.drivers._sqlite_migrate import NEWEST_IN_0_1, SCHEMA_VERSION
from jobs_trio.drivers.sqlite import SqliteDriver, open_sqlite_driver
from jobs_trio.testing.conformance.helpers import new_job
from tests.conftest import ManualClock

# A statement that never ends on its own: only an interrupt stops it.
ENDLESS = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT count(*) FROM n"


def url_of(path: Path) -> str:
    return f"sqlite:///{path}"


def assert_actionable(error: JobsError) -> None:
    assert error.cause and error.fix, error


# The URL.


@pytest.mark.parametrize(
    "url",
    [
        "sqlite://",
        "sqlite:///",
        "sqlite://jobs.db",
        "sqlite:///some/folder/",
        "sqlite:///:memory:",
        "sqlite:///jobs.db?mode=ro",
    ],
)
async def test_a_url_without_a_file_path_is_a_config_error(url: str) -> None:
    with pytest.raises(ConfigError) as caught:
        async with open_driver(url):
            pass
    assert_actionable(caught.value)


async def test_three_slashes_are_relative_four_are_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    async with open_driver("sqlite:///relative.db") as driver:
        assert isinstance(driver, SqliteDriver) and isinstance(driver, Driver)
    assert (tmp_path / "relative.db").is_file()
    absolute = tmp_path / "sub" / "absolute.db"
    absolute.parent.mkdir()
    assert str(absolute).startswith("/")
    async with open_driver(f"sqlite:///{absolute}") as driver:  # sqlite:////tmp/...
        await driver.enqueue([new_job()])
    assert absolute.is_file()


async def test_jobs_survive_a_reopen_and_the_file_is_in_wal_mode(tmp_path: Path) -> None:
    url = url_of(tmp_path / "jobs.db")
    async with open_sqlite_driver(url) as driver:
        [answer] = await driver.enqueue([new_job(key="k")])
    async with open_sqlite_driver(url) as driver:
        record = await driver.get(answer.job_id)
        assert record is not None and record.state is JobState.READY and record.key == "k"
    with sqlite3.connect(tmp_path / "jobs.db") as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        # user_version is 0.1's record: its own newest while 0.1 can use the file.
        assert conn.execute("PRAGMA user_version").fetchone()[0] == NEWEST_IN_0_1
        versions = [v for (v,) in conn.execute("SELECT version FROM schema_history")]
        assert versions[-1] == SCHEMA_VERSION and versions == sorted(set(versions))


# Completions settled together (one statement for a call's plain results, issue 35).


async def settled_together(
    tmp_path: Path, results: list[str | None]
) -> tuple[SqliteDriver, list[str]]:
    url = url_of(tmp_path / "jobs.db")
    async with open_sqlite_driver(url) as driver:
        await driver.enqueue([new_job() for _ in results])
        claims = await driver.claim(["default"], len(results), lease=30, worker_id="w")
        batch = [Complete(c.lease, result=r) for c, r in zip(claims, results, strict=True)]
        try:
            await driver.settle(batch)
        finally:
            ids = [c.job_id for c in claims]
        return driver, ids


async def test_a_result_that_cannot_be_stored_fails_its_settle_as_alone(tmp_path: Path) -> None:
    # A lone surrogate in a result (not one dump_json makes): refused, nothing of the call
    # written, as a completion written alone always was; never stored as bytes that cannot be
    # read back (the JSON of a batched statement carried it through).
    with pytest.raises(JobsError, match="surrogate"):
        await settled_together(tmp_path, ['"ok"', '"\ud800"', None])
    async with open_sqlite_driver(url_of(tmp_path / "jobs.db")) as driver:
        assert {r.state for r in await driver.list_jobs()} == {JobState.RUNNING}


async def test_results_with_nul_and_large_text_are_stored_as_they_are(tmp_path: Path) -> None:
    large = json.dumps('"' * 70_000)  # escaped twice in a batch's JSON: written alone
    results = [
        '"a\x00b"',
        large,
        json.dumps({"é": 1}, ensure_ascii=False),
        "1e400",
        '{"n": NaN}',
        "-Infinity",
        None,
    ]
    _, ids = await settled_together(tmp_path, results)
    path = tmp_path / "jobs.db"
    with contextlib.closing(sqlite3.connect(path)) as conn:
        stored = [
            conn.execute("SELECT result FROM jobs WHERE id = ?", (i,)).fetchone()[0] for i in ids
        ]
    assert stored == results
    async with open_sqlite_driver(url_of(path)) as driver:
        found = [await driver.get(job_id) for job_id in ids]
    # Read back as values; text that is not JSON (a raw NUL in a string) as it is stored, and
    # so is what JSON cannot carry (`--json` would print it as NaN / Infinity: not JSON).
    assert [(r.state, r.result) for r in found if r is not None] == [
        (JobState.COMPLETED, v)
        for v in ['"a\x00b"', '"' * 70_000, {"é": 1}, "1e400", '{"n": NaN}', "-Infinity", None]
    ]


# Files that are not ours: refused, and left byte for byte as they were.


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir()}


async def refused_untouched(path: Path, kind: type[JobsError]) -> JobsError:
    """Opening ``path`` fails with ``kind``, and every file beside it is byte for byte as before."""
    before = snapshot(path.parent)
    with pytest.raises(kind) as caught:
        async with open_sqlite_driver(url_of(path)):
            pass
    assert_actionable(caught.value)
    assert snapshot(path.parent) == before
    return caught.value


async def test_a_schema_a_newer_release_broke_is_refused_and_the_file_left_alone(
    tmp_path: Path,
) -> None:
    path = tmp_path / "jobs.db"
    async with open_sqlite_driver(url_of(path)) as driver:
        await driver.enqueue([new_job()])
    with contextlib.closing(sqlite3.connect(path)) as conn, conn:
        conn.execute(
            "INSERT INTO schema_history VALUES (?, '9000_drop_old.sql', 2, 0, '9.0.0')",
            (SCHEMA_VERSION + 1,),
        )
    refused = await refused_untouched(path, SchemaVersionError)
    assert "compatibility level 2" in refused.cause and "9000_drop_old.sql" in refused.cause
    assert "jobs_trio 9.0.0" in refused.fix


async def test_a_newer_build_without_a_history_is_refused_and_the_file_left_alone(
    tmp_path: Path,
) -> None:
    # A file whose user_version is past this release's and which records no levels: nothing
    # tells whether this release can use it.
    path = tmp_path / "jobs.db"
    async with open_sqlite_driver(url_of(path)) as driver:
        await driver.enqueue([new_job()])
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("DROP TABLE schema_history")
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    refused = await refused_untouched(path, SchemaVersionError)
    assert str(SCHEMA_VERSION + 1) in refused.cause


async def test_another_applications_database_is_refused_and_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, email TEXT)")
    conn.execute("INSERT INTO users (email) VALUES ('a@b.c')")
    conn.commit()
    conn.close()
    refused = await refused_untouched(path, ConfigError)
    assert "users" in refused.cause


@pytest.mark.parametrize(
    "content",
    [b"name,email\na,a@b.c\n" * 50, b"SQLite format 3\x00" + b"\xff" * 4000],
    ids=["text-file", "sqlite-header-then-garbage"],
)
async def test_a_file_that_is_not_a_database_is_refused_and_left_alone(
    tmp_path: Path, content: bytes
) -> None:
    path = tmp_path / "not-a.db"
    path.write_bytes(content)
    await refused_untouched(path, ConfigError)
    assert snapshot(tmp_path) == {"not-a.db": content}  # no -wal, -shm or journal either


# Cancellation: a cancelled call is rolled back and leaves the connection usable.


async def assert_usable(driver: SqliteDriver) -> None:
    assert not driver._conn.in_transaction
    [answer] = await driver.enqueue([new_job()])
    claims = await driver.claim(["default"], 100, lease=30, worker_id="w")
    assert answer.job_id in {c.job_id for c in claims}
    applied = await driver.settle([Complete(c.lease) for c in claims])
    assert sorted(applied) == sorted(c.job_id for c in claims)


async def test_a_cancel_interrupts_a_long_statement_and_rolls_its_transaction_back(
    tmp_path: Path,
) -> None:
    async with open_sqlite_driver(url_of(tmp_path / "jobs.db")) as driver:
        in_statement = trio.Event()
        job = new_job()

        def slow_write(conn: sqlite3.Connection, now: float) -> None:
            conn.execute(
                "INSERT INTO jobs (id, name, queue, state, payload, priority, attempts,"
                " max_attempts, run_at, created_at, updated_at) VALUES"
                " (?, 'n', 'default', 'ready', '{}', 0, 0, 1, ?, ?, ?)",
                (job.job_id, now, now, now),
            )
            trio.from_thread.run_sync(in_statement.set)
            conn.execute(ENDLESS).fetchall()

        # The test reaches into the driver's one door (`_transact`): no public call is slow on
        # purpose, and every public call goes through this door.
        with trio.fail_after(10):  # without the interrupt this would never end
            with trio.CancelScope() as scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(driver._transact, slow_write)
                    await in_statement.wait()
                    scope.cancel()
        assert scope.cancelled_caught
        assert await driver.get(job.job_id) is None  # the INSERT before it was rolled back
        await assert_usable(driver)


async def test_a_cancel_that_lands_between_statements_still_rolls_back(tmp_path: Path) -> None:
    # An interrupt between two statements is a no-op in SQLite; the COMMIT must still not run.
    async with open_sqlite_driver(url_of(tmp_path / "jobs.db")) as driver:
        [answer] = await driver.enqueue([new_job()])
        cancelled = threading.Event()
        in_work = trio.Event()

        def write_then_pause(conn: sqlite3.Connection, now: float) -> None:
            conn.execute("UPDATE jobs SET priority = 99 WHERE id = ?", (answer.job_id,))
            trio.from_thread.run_sync(in_work.set)
            cancelled.wait()

        scope = trio.CancelScope()

        async def call() -> None:
            with scope:
                await driver._transact(write_then_pause)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(call)
            await in_work.wait()
            scope.cancel()
            # Let the cancelled call take the cancel up (it then waits, shielded, for its
            # thread) before the thread may reach its COMMIT: a COMMIT that wins that race
            # is kept, and the call answers instead of raising Cancelled.
            await trio.testing.wait_all_tasks_blocked()
            cancelled.set()
        assert scope.cancelled_caught
        record = await driver.get(answer.job_id)
        assert record is not None and record.priority == 0
        await assert_usable(driver)


async def test_a_cancel_before_the_thread_starts_runs_nothing(tmp_path: Path) -> None:
    async with open_sqlite_driver(url_of(tmp_path / "jobs.db")) as driver:
        # Take the driver's one thread token, so the call is cancelled while it waits for it.
        limiter = driver._door.threads
        await limiter.acquire()
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(driver.enqueue, [new_job()])
                await trio.testing.wait_all_tasks_blocked()
                scope.cancel()
        assert scope.cancelled_caught
        limiter.release()
        assert await driver.list_jobs() == []
        await assert_usable(driver)


# Several connections on one file, as several worker processes would hold.


async def test_calls_still_run_when_abandoned_threads_hold_every_default_token(
    tmp_path: Path,
) -> None:
    # What a worker looks like after its drain abandoned sync job bodies that never return.
    limiter = trio.to_thread.current_default_thread_limiter()
    async with open_sqlite_driver(url_of(tmp_path / "jobs.db")) as driver:
        bodies = [object() for _ in range(int(limiter.total_tokens))]
        for body in bodies:
            await limiter.acquire_on_behalf_of(body)
        try:
            with trio.fail_after(10):
                await assert_usable(driver)
        finally:
            for body in bodies:
                limiter.release_on_behalf_of(body)


async def test_two_connections_claiming_at_once_never_share_a_job(tmp_path: Path) -> None:
    url = url_of(tmp_path / "jobs.db")
    async with open_sqlite_driver(url) as first, open_sqlite_driver(url) as second:
        ids = {a.job_id for a in await first.enqueue([new_job() for _ in range(500)])}
        claimed: list[str] = []

        async def work_through(driver: SqliteDriver, worker_id: str) -> None:
            while claims := await driver.claim(["default"], 7, lease=60, worker_id=worker_id):
                claimed.extend(c.job_id for c in claims)
                applied = await driver.settle([Complete(c.lease) for c in claims])
                assert sorted(applied) == sorted(c.job_id for c in claims)

        async with trio.open_nursery() as nursery:
            for n in range(3):
                nursery.start_soon(work_through, first, f"first-{n}")
                nursery.start_soon(work_through, second, f"second-{n}")
        assert len(claimed) == len(set(claimed)) == 500
        assert set(claimed) == ids
        completed = await second.list_jobs(state=JobState.COMPLETED, limit=1000)
        assert {r.id for r in completed} == ids and all(r.attempts == 1 for r in completed)


async def test_a_write_lock_held_past_busy_timeout_is_retried_then_reported(
    tmp_path: Path,
) -> None:
    path = tmp_path / "jobs.db"
    async with open_sqlite_driver(url_of(path), busy_timeout=0.1) as driver:
        blocker = sqlite3.connect(path, isolation_level=None)
        try:
            blocker.execute("BEGIN IMMEDIATE")
            with pytest.raises(DriverError) as caught:
                await driver.enqueue([new_job()])
            assert_actionable(caught.value)
            assert "locked" in caught.value.cause

            # Released a little after busy_timeout: the tries after it get the job in.
            async with trio.open_nursery() as nursery:
                nursery.start_soon(driver.enqueue, [new_job(key="late")])
                await trio.sleep(0.3)
                blocker.execute("ROLLBACK")
        finally:
            blocker.close()
        [record] = await driver.list_jobs()
        assert record.key == "late"


@pytest.mark.parametrize(
    "poll_interval",
    [
        0.05,  # its look for work, every poll_interval
        # 60 s: only the file's data version (read every CHANGE_LOOK) can end it in time: a web
        # app's process enqueues, a worker's waits.
        60,
    ],
)
async def test_wait_for_work_sees_another_connections_enqueue(
    tmp_path: Path, poll_interval: float
) -> None:
    url = url_of(tmp_path / "jobs.db")
    async with (
        open_sqlite_driver(url, poll_interval=poll_interval) as waiter,
        open_sqlite_driver(url) as other,
    ):
        with trio.fail_after(10):  # the timeout asked for is 60 s
            async with trio.open_nursery() as nursery:
                nursery.start_soon(waiter.wait_for_work, ["default"], 60)
                await trio.testing.wait_all_tasks_blocked()
                await other.enqueue([new_job()])


async def test_a_pause_from_another_connection_reaches_the_watch_long_before_its_poll(
    tmp_path: Path,
) -> None:
    # `jobs-trio pause` in another process waits for each worker's watch to confirm: the
    # watch sees the file's data version move (CHANGE_LOOK), not only its 60 s look.
    url = url_of(tmp_path / "jobs.db")
    async with (
        open_sqlite_driver(url, poll_interval=60) as watcher,
        open_sqlite_driver(url) as other,
    ):
        first = await watcher.wait_for_pauses(None, 60)
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:

                async def watch() -> None:
                    look = await watcher.wait_for_pauses(first.epoch, 60)
                    assert [p.queue for p in look.pauses] == ["emails"]

                nursery.start_soon(watch)
                await trio.testing.wait_all_tasks_blocked()
                await other.pause_queue("emails")


async def test_a_waiter_beside_a_quiet_file_does_not_look_again_before_its_poll(
    tmp_path: Path,
) -> None:
    # The data version moves only with another connection's commits: a waiter beside a file
    # nobody writes waits out its poll rather than looking again every CHANGE_LOOK.
    async with open_sqlite_driver(url_of(tmp_path / "jobs.db"), poll_interval=0.6) as driver:
        looks = 0
        transact = driver._transact

        async def counting(work: Any, *, mode: Any = "write") -> Any:
            nonlocal looks
            looks += mode == "read"
            return await transact(work, mode=mode)

        driver._transact = counting  # type: ignore[method-assign]
        with trio.move_on_after(0.55):
            while True:  # as the claim loop waits: again whenever a wait ends
                await driver.wait_for_work(["default"], 60)
        assert looks == 1  # versions read meanwhile (~5), no second look for work


async def test_a_due_time_on_the_drivers_clock_wakes_wait_for_work(
    tmp_path: Path, manual_clock: ManualClock
) -> None:
    async with open_sqlite_driver(url_of(tmp_path / "jobs.db"), clock=manual_clock) as driver:
        await driver.enqueue([new_job(delay=30)])
        manual_clock.advance(30)
        with trio.fail_after(5):
            await driver.wait_for_work(["default"], timeout=60)


async def test_a_suspect_handed_back_unstarted_is_no_longer_marked_alone(
    tmp_path: Path, manual_clock: ManualClock
) -> None:
    """A suspect claimed alone whose claim's answer was lost is handed back (hand_back_unheld),
    its lapse found unstarted: ready again with its `alone` mark cleared, as the memory and
    PostgreSQL drivers do. Left set, a claim that does not write the column (a worker of the
    previous release, during a rolling upgrade) ran it beside others, and its worker's death
    dead-lettered it X_KILLED_WORKER instead of orphaning it."""
    path = tmp_path / "jobs.db"
    async with open_sqlite_driver(url_of(path), clock=manual_clock) as driver:
        [enqueued] = await driver.enqueue([new_job(queue="q")])
        job_id = enqueued.job_id
        for worker_id in ("dies-0", "dies-1", "rescuer"):
            await driver.claim(["q"], 1, lease=10, worker_id=worker_id)
            manual_clock.advance(11)
        [alone] = await driver.claim(["q"], 1, lease=10, worker_id="lost", alone=True)
        assert alone.job_id == job_id and alone.alone
        assert await driver.hand_back_unheld("lost", ["q"], []) == [job_id]
        assert await driver.claim(["q"], 1, lease=10, worker_id="none") == []  # a suspect
        # The previous release's claim: state, token and lease, the `alone` column untouched.
        with contextlib.closing(sqlite3.connect(path)) as conn, conn:
            (flag,) = conn.execute("SELECT alone FROM jobs WHERE id = ?", (job_id,)).fetchone()
            conn.execute(
                "UPDATE jobs SET state = 'running', token = 'old', worker_id = 'old',"
                " lease_until = ?, attempts = attempts + 1 WHERE id = ?",
                (manual_clock() + 10, job_id),
            )
        assert flag == 0
        manual_clock.advance(11)  # the old worker dies, with others beside the job
        await driver.claim(["q"], 1, lease=10, worker_id="rescuer-2")
        record = await driver.get(job_id)
        assert record is not None and record.state is not JobState.DEAD
        assert record.orphans == 3 and "X_KILLED_WORKER" not in (record.last_error or "")


# Real processes, the deployment this driver is for.

CLAIMER = """
import json, sys, trio
from jobs_trio.drivers.sqlite import open_sqlite_driver
from jobs_trio._core.records import Complete

async def main():
    seen = []
    async with open_sqlite_driver(sys.argv[1]) as driver:
        while claims := await driver.claim(["default"], 5, lease=60, worker_id=sys.argv[2]):
            seen += [c.job_id for c in claims]
            await driver.settle([Complete(c.lease) for c in claims])
    print(json.dumps(seen))

trio.run(main)
"""


@pytest.mark.slow
async def test_worker_processes_on_one_file_never_share_a_job(tmp_path: Path) -> None:
    url = url_of(tmp_path / "jobs.db")
    async with open_sqlite_driver(url) as driver:
        ids = {a.job_id for a in await driver.enqueue([new_job() for _ in range(300)])}
    outputs: list[bytes] = []

    async def run_claimer(n: int) -> None:
        done = await trio.run_process(
            [sys.executable, "-c", CLAIMER, url, f"proc-{n}"], capture_stdout=True
        )
        outputs.append(done.stdout)

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            for n in range(3):
                nursery.start_soon(run_claimer, n)
    claimed = [job_id for out in outputs for job_id in json.loads(out)]
    assert len(claimed) == len(set(claimed)) == 300
    assert set(claimed) == ids


async def test_a_worker_of_three_hundred_queues_runs_a_job_of_each_end(tmp_path: Path) -> None:
    # A queue a tenant: a worker that serves 300 queues claims over all of them at once, which
    # on SQLite failed every claim ("too many terms in compound SELECT": one statement read
    # each queue twice) and the worker ran nothing, logging claim-failed forever.
    from jobs_trio import Registry, open_worker

    registry = Registry()
    ran: list[str] = []
    for n in range(300):

        @registry.job(f"job{n}", queue=f"tenant-{n}")
        async def body(ctx: Any, payload: str) -> None:
            ran.append(payload)

    async with open_sqlite_driver(f"sqlite:///{tmp_path / 'jobs.db'}") as driver:
        for n in (0, 150, 299):
            await registry.require(f"job{n}").enqueue(driver, f"tenant-{n}")
        with trio.fail_after(30):
            async with open_worker(driver, registry, concurrency=10, drain_on_shutdown=False):
                while len(ran) < 3:
                    await trio.sleep(0.05)
    assert sorted(ran) == ["tenant-0", "tenant-150", "tenant-299"]
