# jobs_trio.sync (issue 47): a Flask-style handler, run in a thread as a threaded server runs it,
# enqueues into SQLite and PostgreSQL on the producer's own connections and inside the caller's
# transaction; a Trio worker runs what committed, and a rollback leaves nothing. The producer
# refuses what JobDefinition.enqueue refuses, with the same error and code.
from __future__ import annotations

import contextlib
import datetime as dt
import functools
import json
import sqlite3
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import trio

import jobs_trio
from jobs_trio import ConfigError, DriverError, DuplicateJob, JobState
from jobs_trio.errors import ValueRefused
from jobs_trio.sync import Producer
from jobs_trio.testing import memory_driver, new_worker, run_until_idle
from tests.apps.producer_app import flask_style_signup, registry, welcome


async def migrated(url: str, **options: Any) -> None:
    async with jobs_trio.open_driver(url, migrate=True, **options):
        pass


async def run_jobs(driver: jobs_trio.Driver) -> dict[str, str]:
    """Every job due, run by a Trio worker: each job's payload address and final state."""
    await run_until_idle(new_worker(driver, registry), wait=False)
    return {
        json.loads(job.payload)["to"]: job.state.value
        for job in await driver.list_jobs(name="signup.welcome")
    }


@pytest.fixture
async def sqlite_url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    await migrated(url)
    return url


async def test_a_flask_style_handler_enqueues_into_sqlite_and_a_trio_worker_runs_it(
    sqlite_url: str,
) -> None:
    path = sqlite_url.removeprefix("sqlite:///")
    with Producer(sqlite_url) as producer:

        def request(email: str, commit: bool) -> None:
            conn = sqlite3.connect(path)  # the DB-API's implicit transaction: the caller's
            try:
                flask_style_signup(producer, email, conn)
                conn.commit() if commit else conn.rollback()
            finally:
                conn.close()

        own = await trio.to_thread.run_sync(flask_style_signup, producer, "own@x")
        await trio.to_thread.run_sync(request, "committed@x", True)
        await trio.to_thread.run_sync(request, "rolled-back@x", False)
    async with jobs_trio.open_driver(sqlite_url) as driver:
        assert await run_jobs(driver) == {"own@x": "completed", "committed@x": "completed"}
        job = await driver.get(own)
        assert job is not None and job.queue == "emails" and job.result == {"sent_to": "own@x"}


async def test_an_autocommit_sqlite_connection_outside_a_transaction_commits_at_once(
    sqlite_url: str,
) -> None:
    path = sqlite_url.removeprefix("sqlite:///")
    conn = sqlite3.connect(path, isolation_level=None)
    with Producer(sqlite_url) as producer:
        flask_style_signup(producer, "auto@x", conn)
        assert not conn.in_transaction  # its own transaction, committed: nothing left open
        conn.execute("BEGIN")
        flask_style_signup(producer, "in-begin@x", conn)
        conn.rollback()
    async with jobs_trio.open_driver(sqlite_url) as driver:
        assert await run_jobs(driver) == {"auto@x": "completed"}


class Pep249Autocommit(sqlite3.Connection):
    """A connection as Python 3.12's ``sqlite3.connect(path, autocommit=True)`` makes it (PEP
    249's ``autocommit``): SQLite's own autocommit, and commit() and rollback() that do nothing.
    The real one where this Python has it; this stand-in on 3.11."""

    autocommit = True

    def commit(self) -> None:
        pass

    def rollback(self) -> None:
        pass


def pep249_autocommit(path: str) -> sqlite3.Connection:
    if sys.version_info >= (3, 12):
        return sqlite3.connect(path, autocommit=True)
    return sqlite3.connect(path, isolation_level=None, factory=Pep249Autocommit)


async def test_a_pep249_autocommit_sqlite_connection_commits_the_job_at_once(
    sqlite_url: str,
) -> None:
    """Committed by a COMMIT statement: its commit() does nothing, and the job would have
    stayed uncommitted, the file's write lock held against every worker, until it closed."""
    path = sqlite_url.removeprefix("sqlite:///")
    with contextlib.closing(pep249_autocommit(path)) as conn, Producer(sqlite_url) as producer:
        job_id = producer.enqueue(welcome, {"to": "auto@x"}, connection=conn)
        assert not conn.in_transaction
        with contextlib.closing(sqlite3.connect(path, timeout=0.1)) as other:
            assert other.execute("SELECT id FROM jobs").fetchall() == [(job_id,)]
            other.execute("BEGIN IMMEDIATE")  # the write lock is free
            other.rollback()


async def test_a_write_locked_file_is_waited_out_then_named(sqlite_url: str) -> None:
    """The busy timeout is waited, and the error says who to look for: it said "check the
    disk (space, permissions)"."""
    path = sqlite_url.removeprefix("sqlite:///")
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as holder:
        holder.execute("BEGIN IMMEDIATE")
        with Producer(sqlite_url, busy_timeout=0.3) as producer:
            started = time.monotonic()
            with pytest.raises(DriverError, match="stayed locked by another connection") as own:
                producer.enqueue(welcome, {"to": "a"})
            assert time.monotonic() - started >= 0.3
            assert "busy_timeout=" in own.value.fix
            with contextlib.closing(sqlite3.connect(path, timeout=0.05)) as conn:
                with pytest.raises(DriverError, match="stayed locked"):
                    producer.enqueue(welcome, {"to": "a"}, connection=conn)
                assert not conn.in_transaction
        holder.rollback()


async def test_the_producer_writes_the_drivers_rows(sqlite_url: str) -> None:
    """Key, delay, priority, context and events: the rows a Trio enqueue would write."""
    with Producer(sqlite_url) as producer:
        first = producer.enqueue(welcome, {"to": "a"}, key="welcome:a", priority=-3, delay=60)
        assert producer.enqueue(welcome, {"to": "a"}, key="welcome:a") == first
        with pytest.raises(DuplicateJob) as raised:
            producer.enqueue(welcome, {"to": "a"}, key="welcome:a", on_duplicate="raise")
        assert raised.value.existing_id == first
        later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
        many = producer.enqueue_many(welcome, [{"to": "b"}, {"to": "c"}], run_at=later)
        assert producer.enqueue_many(welcome, []) == []
        tenant = producer.enqueue(welcome, {"to": "d"}, context={"tenant": "t1"})
        event = producer.send_event("signup.done", {"user": "a"}, key="a")
    async with jobs_trio.open_driver(sqlite_url) as driver:
        job = await driver.get(first)
        assert job is not None and job.key == "welcome:a" and job.priority == -3
        assert 55 < job.run_at - job.created_at <= 60
        for job_id in many:
            job = await driver.get(job_id)
            assert job is not None and abs(job.run_at - later.timestamp()) < 2
        job = await driver.get(tenant)
        assert job is not None and json.loads(job.context or "{}") == {"tenant": "t1"}
        look = await driver.look_for_event("signup.done", key="a", since=None)
        assert look.found is not None and look.found.id == event


async def _a_sent_event_wakes_the_job_suspended_on_it(url: str, **options: Any) -> None:
    events = jobs_trio.Registry()

    @events.job("signup.wait")
    async def wait(ctx: jobs_trio.JobContext, payload: None) -> Any:
        return await ctx.step.wait_for_event("paid", "order.paid", match="o-1", timeout=3600)

    async with jobs_trio.open_driver(url, **options) as driver:
        job_id = await wait.enqueue(driver)
        worker = new_worker(driver, events)
        [outcome] = await run_until_idle(worker, wait=False)
        assert outcome.kind == "suspended"
        with Producer(url, **options) as producer:
            if url.startswith("sqlite"):
                send = functools.partial(producer.send_event, "order.paid", {"total": 3})
            else:  # in the caller's transaction: the job wakes when it commits
                import psycopg

                def send(key: str) -> None:
                    with psycopg.connect(url) as conn:
                        producer.send_event("order.paid", {"total": 3}, key=key, connection=conn)
                        conn.commit()

            await trio.to_thread.run_sync(functools.partial(send, key="o-2"))  # another key
            assert (await driver.get(job_id)).state is JobState.SUSPENDED  # type: ignore[union-attr]
            await trio.to_thread.run_sync(functools.partial(send, key="o-1"))
        [outcome] = await run_until_idle(worker, wait=False)
        assert outcome.kind == "completed"
        job = await driver.get(job_id)
        assert job is not None and job.result == {"total": 3}


async def test_a_sent_event_wakes_the_job_suspended_on_it(sqlite_url: str) -> None:
    await _a_sent_event_wakes_the_job_suspended_on_it(sqlite_url)


# Bad input: the producer refuses what the Trio API refuses, the same way, and writes nothing.

BAD_CALLS: list[tuple[str, Callable[[Any], Any]]] = [
    ("payload", lambda e: e(welcome, {"to": b"bytes"})),
    ("huge payload", lambda e: e(welcome, {"to": "x" * (2 << 20)})),
    ("key", lambda e: e(welcome, {"to": "a"}, key="nul\x00")),
    ("delay", lambda e: e(welcome, {"to": "a"}, delay=-1)),
    ("run_at", lambda e: e(welcome, {"to": "a"}, run_at=dt.datetime(2030, 1, 1))),
    ("delay and run_at", lambda e: e(welcome, {"to": "a"}, delay=1, run_at=1e9)),
    ("priority", lambda e: e(welcome, {"to": "a"}, priority=2**40)),
    ("context", lambda e: e(welcome, {"to": "a"}, context={"tenant": 3})),
]


def _refusal(call: Callable[[], Any]) -> tuple[type[BaseException], str, str]:
    try:
        call()
    except jobs_trio.JobsError as exc:
        return type(exc), exc.code, str(exc)
    raise AssertionError("not refused")


def refused_by_trio(call: Callable[..., Any]) -> tuple[type[BaseException], str, str]:
    """How the Trio API refuses ``call`` (a coroutine function of the memory driver's API):
    it must refuse before its first await, so it is stepped once, outside Trio."""

    def step() -> None:
        coroutine = call()
        try:
            coroutine.send(None)
        except StopIteration:
            raise AssertionError("the Trio API accepted it") from None
        finally:
            coroutine.close()

    return _refusal(step)


@pytest.mark.parametrize("what, call", BAD_CALLS, ids=[what for what, _ in BAD_CALLS])
async def test_bad_input_is_refused_as_the_trio_api_refuses_it(
    sqlite_url: str, what: str, call: Callable[[Any], Any]
) -> None:
    driver = memory_driver()

    def by_trio(job: Any, *args: Any, **kwargs: Any) -> Any:
        return refused_by_trio(lambda: job.enqueue(driver, *args, **kwargs))

    with Producer(sqlite_url) as producer:
        assert _refusal(lambda: call(producer.enqueue)) == call(by_trio)
    async with jobs_trio.open_driver(sqlite_url) as opened:
        assert await opened.list_jobs() == []


async def test_a_bad_batch_or_event_is_refused_as_the_trio_api_refuses_it(sqlite_url: str) -> None:
    driver = memory_driver()
    batch = [{"to": "a"}, {"to": b"x"}]
    with Producer(sqlite_url) as producer:
        assert _refusal(lambda: producer.enqueue_many(welcome, batch)) == refused_by_trio(
            lambda: welcome.enqueue_many(driver, batch)
        )
        for name, payload, key in [("bad\nname", None, None), ("ok", {1: 2}, None), ("ok", 1, "")]:
            by_producer = functools.partial(producer.send_event, name, payload, key=key)
            by_trio = functools.partial(jobs_trio.send_event, driver, name, payload, key=key)
            assert _refusal(by_producer) == refused_by_trio(by_trio)
    async with jobs_trio.open_driver(sqlite_url) as opened:
        assert await opened.list_jobs() == []


async def test_a_store_the_producer_cannot_use_is_refused_with_the_fix(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not a jobs_trio database") as raised:
        Producer(f"sqlite:///{tmp_path / 'none.db'}").enqueue(welcome, {"to": "a"})
    assert "jobs-trio migrate" in raised.value.fix
    with pytest.raises(ConfigError, match="memory://"):
        Producer("memory://")
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    await migrated(url)
    other = sqlite3.connect(tmp_path / "other.db")
    with Producer(url) as producer, pytest.raises(ConfigError, match="not to the driver's file"):
        producer.enqueue(welcome, {"to": "a"}, connection=other)
    with Producer(url) as producer, pytest.raises(ConfigError, match="sqlite3 connection"):
        producer.enqueue(welcome, {"to": "a"}, connection=object())


# PostgreSQL, through psycopg.


@pytest.fixture
async def pg_url(postgres_url: str, pg_schema: str) -> AsyncIterator[str]:
    async with jobs_trio.open_driver(
        postgres_url, schema=pg_schema, migrate=True, drop_schema_on_close=True
    ):
        yield postgres_url


@pytest.mark.postgres
async def test_a_flask_style_handler_enqueues_into_postgres_and_a_trio_worker_runs_it(
    pg_url: str, pg_schema: str
) -> None:
    import psycopg

    with Producer(pg_url, schema=pg_schema) as producer:

        def request(email: str, commit: bool, autocommit: bool) -> None:
            with psycopg.connect(pg_url, autocommit=autocommit) as conn:
                if autocommit:
                    with conn.transaction() as tx:  # an explicit block, as Django's atomic()
                        flask_style_signup(producer, email, conn)
                        if not commit:
                            raise psycopg.Rollback(tx)
                else:  # psycopg's default: the DB-API's implicit transaction, the caller's
                    flask_style_signup(producer, email, conn)
                    conn.commit() if commit else conn.rollback()

        await trio.to_thread.run_sync(flask_style_signup, producer, "own@x")
        await trio.to_thread.run_sync(flask_style_signup, producer, "own-again@x")  # kept conn
        for autocommit in (False, True):
            await trio.to_thread.run_sync(request, f"committed-{autocommit}@x", True, autocommit)
            await trio.to_thread.run_sync(request, f"rolled-back-{autocommit}@x", False, autocommit)
        with psycopg.connect(pg_url, autocommit=True) as conn:
            flask_style_signup(producer, "autocommit@x", conn)  # no transaction: its own
    async with jobs_trio.open_driver(pg_url, schema=pg_schema) as driver:
        assert await run_jobs(driver) == {
            "own@x": "completed",
            "own-again@x": "completed",
            "committed-False@x": "completed",
            "committed-True@x": "completed",
            "autocommit@x": "completed",
        }


@pytest.mark.postgres
async def test_a_sent_event_wakes_the_job_suspended_on_it_on_postgres(
    pg_url: str, pg_schema: str
) -> None:
    await _a_sent_event_wakes_the_job_suspended_on_it(pg_url, schema=pg_schema)


@pytest.mark.postgres
async def test_postgres_keys_events_and_refusals(pg_url: str, pg_schema: str) -> None:
    import psycopg

    with Producer(pg_url, schema=pg_schema) as producer:
        first = producer.enqueue(welcome, {"to": "a"}, key="welcome:a")
        with psycopg.connect(pg_url) as conn:
            assert producer.enqueue(welcome, {"to": "a"}, key="welcome:a", connection=conn) == first
            # A write the database refuses is undone alone (a savepoint): the caller's
            # transaction goes on, and what it wrote before stays.
            conn.execute(
                f"CREATE FUNCTION {pg_schema}.refuse() RETURNS trigger LANGUAGE plpgsql AS"
                " $$ BEGIN IF NEW.payload LIKE '%refuse%' THEN RAISE 'refused'; END IF;"
                " RETURN NEW; END $$"
            )
            conn.execute(
                f"CREATE TRIGGER refuse BEFORE INSERT ON {pg_schema}.jobs"
                f" FOR EACH ROW EXECUTE FUNCTION {pg_schema}.refuse()"
            )
            kept = producer.enqueue(welcome, {"to": "kept"}, connection=conn)
            with pytest.raises(ValueRefused):
                producer.enqueue_many(welcome, [{"to": "ok"}, {"to": "refuse"}], connection=conn)
            conn.execute("SELECT 1")
            producer.send_event("signup.done", {"user": "a"}, connection=conn)
            conn.commit()
        many = producer.enqueue_many(welcome, [{"to": str(i)} for i in range(100)])
        assert len(set(many)) == 100
    async with jobs_trio.open_driver(pg_url, schema=pg_schema) as driver:
        assert len(await driver.list_jobs(state=JobState.READY, limit=1000)) == 102
        assert await driver.get(kept) is not None
        look = await driver.look_for_event("signup.done", key=None, since=None)
        assert look.found is not None
    with pytest.raises(ConfigError, match="has no jobs_trio tables") as raised:
        Producer(pg_url, schema=pg_schema + "_none").enqueue(welcome, {"to": "a"})
    assert "jobs-trio migrate" in raised.value.fix


@pytest.mark.postgres
async def test_a_window_is_refused_in_a_transaction_whose_snapshot_predates_its_lock(
    pg_url: str, pg_schema: str
) -> None:
    """In REPEATABLE READ the window's look reads the transaction's first snapshot: a job of the
    key committed (and finished) since was missed, and a second job written in its window."""
    import psycopg

    with Producer(pg_url, schema=pg_schema) as producer:
        with psycopg.connect(pg_url) as conn:
            conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            conn.execute("SELECT 1")  # the snapshot, taken here
            first = producer.enqueue(welcome, {"to": "a"}, key="day:a", unique_for=86400)
            with psycopg.connect(pg_url, autocommit=True) as other:
                other.execute(
                    f"UPDATE {pg_schema}.jobs SET state = 'completed' WHERE id = %s", [first]
                )
            with pytest.raises(ConfigError, match="REPEATABLE READ") as raised:
                producer.enqueue(
                    welcome, {"to": "a"}, key="day:a", unique_for=86400, connection=conn
                )
            assert "READ COMMITTED" in raised.value.fix
            conn.execute("SELECT 1")  # only the enqueue was undone: the transaction goes on
            producer.enqueue(welcome, {"to": "b"}, key="live:b", connection=conn)  # no window
            conn.commit()
        with psycopg.connect(pg_url) as conn:  # READ COMMITTED: the finished job holds the key
            again = producer.enqueue(
                welcome, {"to": "a"}, key="day:a", unique_for=86400, connection=conn
            )
            conn.commit()
        assert again == first
    with psycopg.connect(pg_url) as conn:
        keys = conn.execute(f"SELECT key FROM {pg_schema}.jobs ORDER BY key").fetchall()
    assert keys == [("day:a",), ("live:b",)]


@pytest.mark.postgres
async def test_an_aborted_callers_transaction_is_named_as_such(pg_url: str, pg_schema: str) -> None:
    import psycopg

    with Producer(pg_url, schema=pg_schema) as producer, psycopg.connect(pg_url) as conn:
        with pytest.raises(psycopg.errors.DivisionByZero):
            conn.execute("SELECT 1 / 0")
        with pytest.raises(ConfigError, match="already aborted") as raised:
            producer.enqueue(welcome, {"to": "a"}, connection=conn)
        assert "roll it back" in raised.value.fix
        conn.rollback()
        producer.enqueue(welcome, {"to": "a"}, connection=conn)
        conn.commit()


async def test_a_producer_used_again_in_a_forked_child_loses_nothing(sqlite_url: str) -> None:
    # A web server that forks its workers after the app made its producer: the child wrote
    # through the parent's kept connection, without the parent's file locks (a fork does not
    # inherit them), and the parent's close deleted the WAL the child wrote to. The child's
    # enqueues returned ids and were lost (found by review).
    import os

    path = sqlite_url.removeprefix("sqlite:///")
    producer = Producer(sqlite_url)
    producer.enqueue(welcome, {"to": "parent@example.com"})
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: waits for the parent's close, enqueues, reports, leaves
        os.close(write)
        os.read(read, 1)
        try:  # and leaves as a server's worker process does, without a close
            for n in range(5):
                producer.enqueue(welcome, {"to": f"child{n}@example.com"})
        finally:
            os._exit(0)
    os.close(read)
    producer.close()
    os.write(write, b"x")
    os.close(write)
    _, status = os.waitpid(pid, 0)
    assert status == 0
    with contextlib.closing(sqlite3.connect(path)) as conn:
        assert conn.execute("SELECT count(*) FROM jobs").fetchone()[0] == 6


@pytest.mark.postgres
async def test_a_serialization_failure_in_the_callers_transaction_says_to_run_it_again(
    pg_url: str, pg_schema: str
) -> None:
    # In REPEATABLE READ, a key another transaction committed since the snapshot cannot be
    # looked at: PostgreSQL ends the transaction (40001). "The call can be retried" failed the
    # same way inside it (found by review): the transaction must run again from its start.
    import psycopg

    with Producer(pg_url, schema=pg_schema) as producer, psycopg.connect(pg_url) as conn:
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        conn.execute("SELECT 1")  # the snapshot, taken here
        producer.enqueue(welcome, {"to": "a"}, key="k")  # committed since, by another
        with pytest.raises(DriverError) as raised:
            producer.enqueue(welcome, {"to": "a"}, key="k", connection=conn)
        conn.rollback()
    assert "40001" in str(raised.value)
    assert "run it again from its start" in raised.value.fix


async def test_a_write_on_a_snapshot_older_than_the_file_says_to_run_it_again(
    sqlite_url: str,
) -> None:
    # A caller's transaction that read the file before another connection wrote it cannot
    # write: SQLite says so at once (SQLITE_BUSY_SNAPSHOT), which read as "stayed locked past
    # the busy timeout: raise the busy timeout" (found by review).
    path = sqlite_url.removeprefix("sqlite:///")
    with (
        Producer(sqlite_url) as producer,
        contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn,
    ):
        conn.execute("BEGIN")
        conn.execute("SELECT count(*) FROM jobs").fetchone()  # the snapshot, taken here
        producer.enqueue(welcome, {"to": "other"})  # another connection writes the file
        with pytest.raises(DriverError) as raised:
            producer.enqueue(welcome, {"to": "a"}, connection=conn)
        conn.execute("ROLLBACK")
    assert "run it again from its start" in raised.value.fix
    assert "busy timeout" not in raised.value.fix.split(";")[0]


@pytest.mark.parametrize(
    "options",
    [
        {"busy_timeout": float("nan")},
        {"busy_timeout": float("inf")},
        {"busy_timeout": "5"},
        {"busy_timeout": -1},
        {"keep": -1},
        {"keep": "2"},
    ],
)
def test_a_producers_options_are_checked_where_they_are_given(
    options: dict[str, Any], tmp_path: Path
) -> None:
    # They failed at the first write, with a bare ValueError, OverflowError or TypeError and no
    # code (found by review); the driver's busy_timeout is checked the same way.
    from jobs_trio.errors import InvalidArgument

    with pytest.raises(InvalidArgument) as refused:
        Producer(f"sqlite:///{tmp_path / 'jobs.db'}", **options)
    assert next(iter(options)) in str(refused.value) and refused.value.fix


async def test_the_asyncio_producers_pool_size_and_the_drivers_busy_timeout_are_checked(
    tmp_path: Path,
) -> None:
    from jobs_trio.aio import Producer as AsyncProducer
    from jobs_trio.errors import InvalidArgument

    with pytest.raises(InvalidArgument, match="pool_size"):
        AsyncProducer(f"sqlite:///{tmp_path / 'jobs.db'}", pool_size=0)
    with pytest.raises(InvalidArgument, match="busy_timeout"):
        async with jobs_trio.open_driver(f"sqlite:///{tmp_path / 'jobs.db'}", busy_timeout=1e12):
            pass


@pytest.mark.parametrize("kind", ["another application's", "not sqlite", "new"])
def test_a_file_that_is_no_jobs_trio_database_is_refused_with_the_fix_that_fits(
    kind: str, tmp_path: Path
) -> None:
    # `jobs-trio migrate` makes a new file one; another application's file or one that is not
    # SQLite's it refuses too, so saying to run it there sent the reader round (found by review).
    path = tmp_path / "jobs.db"
    if kind == "not sqlite":
        path.write_text("hello")
    else:
        with contextlib.closing(sqlite3.connect(path)) as conn, conn:
            if kind != "new":
                conn.execute("CREATE TABLE orders (id INTEGER)")
    with pytest.raises(ConfigError) as refused:
        Producer(f"sqlite:///{path}").enqueue(welcome, {"to": "a"})
    assert ("jobs-trio migrate" in refused.value.fix) == (kind == "new")


@pytest.mark.postgres
async def test_the_workers_url_with_the_pools_idle_bound_is_one_the_producer_takes(
    pg_url: str, pg_schema: str
) -> None:
    # docs/drivers.md sets the pool's idle bound in the URL the workers use, and producers are
    # told to use that URL: psycopg refused the query parameter it does not know.
    url = f"{pg_url}?idle_in_transaction_session_timeout=5s"
    with Producer(url, schema=pg_schema) as producer:
        job_id = await trio.to_thread.run_sync(producer.enqueue, welcome, {"to": "bound@x"})
    async with jobs_trio.open_driver(url, schema=pg_schema) as driver:
        assert await driver.get(job_id) is not None
