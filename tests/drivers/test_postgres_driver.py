# What only the PostgreSQL driver has to get right: migrations, schema checks, transactional
# enqueue, the trio-asyncio loop it runs on, cancels reaching the server, and lost connections.
# The shared contract is jobs_trio.testing.conformance; these need a server (skipped without,
# failed in CI).
from __future__ import annotations

import contextlib
import functools
import gc
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import trio

from jobs_trio._core.errors import ConfigError, DriverError, RowLocked, SchemaVersionError
from jobs_trio._core.records import Complete, JobState
from jobs_trio.testing.conformance.helpers import a_waiting_worker, new_job
from tests.conftest import require_postgres
from tests.helpers.turn_counter import TurnCounter

pytestmark = pytest.mark.postgres

trio_asyncio = pytest.importorskip("trio_asyncio")
asyncpg = pytest.importorskip("asyncpg")

from jobs_trio.drivers import _postgres_bridge as postgres_bridge  # noqa: E402
from jobs_trio.drivers._postgres_migrate import NEWEST_IN_0_1  # noqa: E402
from jobs_trio.drivers._postgres_open import _report_loop_error as report_loop_error  # noqa: E402
from jobs_trio.drivers._postgres_sql import load_statements  # noqa: E402
from jobs_trio.drivers.postgres import PostgresDriver, migrate, open_postgres_driver  # noqa: E402


@pytest.fixture
def url() -> str:
    return require_postgres()


@contextlib.asynccontextmanager
async def on_a_loop() -> AsyncIterator[Any]:
    """The trio-asyncio loop the test already runs in, else a fresh one for the block."""
    loop = trio_asyncio.current_loop.get()
    if loop is not None:
        yield loop
        return
    async with trio_asyncio.open_loop() as own:
        # As the driver's own loop does: an error asyncio reports with no operation waiting
        # for it (a pool's connect given up as the pool closes, on this loop when a test opens
        # a bridge beside its admin) is logged, not raised into the test (CI at 26d2ee3:
        # test_schema_levels failed with "unexpected connection_lost() call" from such a
        # future, no statement of the test's having failed).
        own.set_exception_handler(report_loop_error)
        yield own


class Admin:
    """A plain asyncpg connection for the test's own look at the server (pg_stat_activity,
    pg_terminate_backend, hand-made schema damage)."""

    def __init__(self, loop: Any, conn: Any) -> None:
        self.loop = loop
        self.conn = conn

    async def fetchval(self, query: str, *args: object) -> Any:
        return await trio_asyncio.aio_as_trio(self.conn.fetchval, loop=self.loop)(query, *args)

    async def fetch(self, query: str, *args: object) -> list[Any]:
        rows: list[Any] = await trio_asyncio.aio_as_trio(self.conn.fetch, loop=self.loop)(
            query, *args
        )
        return rows

    async def fetchval_now(self, query: str, *args: object) -> Any:
        """``fetchval`` of a statistics view as it is now. The server reads pg_stat_activity once
        per transaction: from inside one (the test's own, holding a lock) every look answered
        what the first saw, and a wait that began after it was never seen (CI: 20 s of polls
        found no worker waiting on the lock it was waiting on)."""
        await self.execute("SELECT pg_stat_clear_snapshot()")
        return await self.fetchval(query, *args)

    async def execute(self, query: str, *args: object) -> Any:
        return await trio_asyncio.aio_as_trio(self.conn.execute, loop=self.loop)(query, *args)

    async def backends(self, application_name: str) -> list[int]:
        rows = await trio_asyncio.aio_as_trio(self.conn.fetch, loop=self.loop)(
            "SELECT pid FROM pg_stat_activity WHERE application_name = $1", application_name
        )
        return sorted(row["pid"] for row in rows)

    async def kill(self, application_name: str) -> list[int]:
        pids = await self.backends(application_name)
        for pid in pids:
            await self.fetchval("SELECT pg_terminate_backend($1)", pid)
        return pids


@contextlib.asynccontextmanager
async def open_admin(url: str, *, drop: str | None = None) -> AsyncIterator[Admin]:
    """An admin connection; ``drop`` names a schema to drop on the way out, whatever happened."""
    async with on_a_loop() as loop:
        conn = await trio_asyncio.aio_as_trio(asyncpg.connect, loop=loop)(url)
        admin = Admin(loop, conn)
        try:
            yield admin
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(10):
                if drop is not None:
                    await admin.execute(f'DROP SCHEMA IF EXISTS "{drop}" CASCADE')
                await trio_asyncio.aio_as_trio(conn.close, loop=loop)()


@contextlib.asynccontextmanager
async def driver_and_admin(
    url: str, pg_schema: str, **options: Any
) -> AsyncIterator[tuple[PostgresDriver, Admin]]:
    """A driver on a schema of its own (dropped after) and an admin connection beside it."""
    async with (
        open_postgres_driver(
            url, schema=pg_schema, migrate=True, drop_schema_on_close=True, **options
        ) as driver,
        open_admin(url) as admin,
    ):
        yield driver, admin


async def eventually(check: Callable[[], Awaitable[bool]], *, within: float = 10.0) -> None:
    """Poll a server-side effect until it holds, failing after ``within`` seconds."""
    with trio.fail_after(within):
        while not await check():
            await trio.sleep(0.02)


# --- migrations and schema checks ---


async def test_migrate_is_idempotent_and_concurrent_calls_apply_once(
    url: str, pg_schema: str
) -> None:
    async with open_admin(url, drop=pg_schema) as admin:
        results: list[list[int]] = []

        async def one() -> None:
            results.append(await migrate(url, schema=pg_schema))

        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                for _ in range(5):
                    nursery.start_soon(one)
        shipped = [m.version for m in load_statements(pg_schema).migrations]
        # Each migration is a transaction of its own: the racers may share them out, but each
        # is applied by one of them, once.
        assert sorted(v for applied in results for v in applied) == shipped
        assert await migrate(url, schema=pg_schema) == []
        versions = await admin.fetchval(
            f'SELECT array_agg(version ORDER BY version) FROM "{pg_schema}".schema_history'
        )
        assert versions == shipped
        # 0.1's record holds what 0.1 knows, and nothing it would refuse.
        record = await admin.fetchval(
            f'SELECT array_agg(version ORDER BY version) FROM "{pg_schema}".migrations'
        )
        assert record == [v for v in shipped if v <= NEWEST_IN_0_1]
        # A migrated schema opens without migrate=True.
        async with open_postgres_driver(url, schema=pg_schema) as driver:
            assert await driver.list_jobs() == []


async def test_opening_an_unmigrated_schema_names_the_fix(url: str, pg_schema: str) -> None:
    with pytest.raises(ConfigError, match="jobs-trio migrate") as caught:
        async with open_postgres_driver(url, schema=pg_schema):
            pass  # pragma: no cover
    assert pg_schema in caught.value.cause


async def test_a_schema_migrated_by_a_newer_version_is_refused(url: str, pg_schema: str) -> None:
    async with open_admin(url, drop=pg_schema) as admin:
        await migrate(url, schema=pg_schema)
        await admin.execute(
            f'INSERT INTO "{pg_schema}".migrations (version, applied_at) VALUES (9999, 0)'
        )
        with pytest.raises(SchemaVersionError, match="9999"):
            async with open_postgres_driver(url, schema=pg_schema):
                pass  # pragma: no cover
        with pytest.raises(SchemaVersionError):
            async with open_postgres_driver(url, schema=pg_schema, migrate=True):
                pass  # pragma: no cover
        with pytest.raises(SchemaVersionError) as caught:
            await migrate(url, schema=pg_schema)
        assert caught.value.fix and not caught.value.retryable


@pytest.mark.parametrize(
    "bad",
    ["", "Jobs", "1jobs", "jobs-trio", 'x"; DROP TABLE y; --', "a" * 64, "pg_jobs", "jobs trio"],
)
async def test_bad_schema_names_are_refused_before_any_sql(bad: str) -> None:
    # No server needed: the name is checked before a connection is made.
    with pytest.raises(ConfigError) as caught:
        async with open_postgres_driver("postgresql://nobody@127.0.0.1:1/none", schema=bad):
            pass  # pragma: no cover
    assert caught.value.fix
    with pytest.raises(ConfigError):
        await migrate("postgresql://nobody@127.0.0.1:1/none", schema=bad)


async def test_a_keyword_schema_name_is_quoted(url: str) -> None:
    async with open_postgres_driver(
        url, schema="user", migrate=True, drop_schema_on_close=True
    ) as driver:
        await driver.enqueue([new_job()])
        assert len(await driver.list_jobs()) == 1


async def test_an_unreachable_server_is_a_driver_error_with_a_fix() -> None:
    with pytest.raises(DriverError, match="cannot reach PostgreSQL") as caught:
        async with open_postgres_driver("postgresql://postgres@127.0.0.1:1/postgres"):
            pass  # pragma: no cover
    assert caught.value.retryable and caught.value.fix


# --- the trio-asyncio loop ---


async def test_the_driver_opens_its_own_loop_when_the_caller_has_none(
    url: str, pg_schema: str
) -> None:
    assert trio_asyncio.current_loop.get() is None
    async with open_postgres_driver(
        url, schema=pg_schema, migrate=True, drop_schema_on_close=True
    ) as driver:
        assert driver.loop is not None
        await claim_and_complete_one(driver)
    assert trio_asyncio.current_loop.get() is None


async def test_the_driver_uses_the_loop_the_caller_already_runs(url: str, pg_schema: str) -> None:
    async with (
        trio_asyncio.open_loop() as loop,
        open_postgres_driver(
            url, schema=pg_schema, migrate=True, drop_schema_on_close=True
        ) as driver,
    ):
        assert driver.loop is loop
        await claim_and_complete_one(driver)


async def test_an_error_asyncio_reports_on_its_own_loop_is_logged_and_ends_nothing(
    url: str, pg_schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    # A future whose exception nobody read (asyncpg's TLS upgrade when a connect is given up
    # as its connection closes): trio-asyncio's own handler raised it into the loop's nursery,
    # and the worker ended X_UNEXPECTED with no job at fault (CI, 2026-12-02).
    caplog.set_level(logging.WARNING, logger="jobs_trio")
    async with open_postgres_driver(
        url, schema=pg_schema, migrate=True, drop_schema_on_close=True
    ) as driver:
        stray = driver.loop.create_future()
        stray.set_exception(ConnectionError("unexpected connection_lost() call"))
        del stray
        gc.collect()  # asyncio reports it as the future is collected
        await trio.sleep(0.05)
        await claim_and_complete_one(driver)
    [said] = [r for r in caplog.records if getattr(r, "event", "") == "jobs.driver.loop-error"]
    assert "connection_lost" in said.fields["error"]  # type: ignore[attr-defined]


async def test_an_error_asyncio_reports_on_the_admins_own_loop_ends_no_test(
    url: str, caplog: pytest.LogCaptureFixture
) -> None:
    # The tests' admin loop (on_a_loop) handles such a future as the driver's loop does: a
    # stray error from a connect given up beside it is said, and the test goes on.
    caplog.set_level(logging.WARNING, logger="jobs_trio")
    async with open_admin(url) as admin:
        stray = admin.loop.create_future()
        stray.set_exception(ConnectionError("unexpected connection_lost() call"))
        del stray
        gc.collect()
        await trio.sleep(0.05)
        assert await admin.fetchval("SELECT 1") == 1
    assert any(getattr(r, "event", "") == "jobs.driver.loop-error" for r in caplog.records)


async def claim_and_complete_one(driver: PostgresDriver) -> None:
    [enqueued] = await driver.enqueue([new_job()])
    [claim] = await driver.claim(["default"], 10, lease=30, worker_id="w")
    assert claim.job_id == enqueued.job_id
    assert await driver.settle([Complete(claim.lease, result="1")]) == [claim.job_id]
    record = await driver.get(claim.job_id)
    assert record is not None and record.state is JobState.COMPLETED


# --- transactional enqueue ---


async def test_enqueue_on_the_applications_transaction(url: str, pg_schema: str) -> None:
    async with (
        trio_asyncio.open_loop() as loop,
        open_postgres_driver(
            url, schema=pg_schema, migrate=True, drop_schema_on_close=True
        ) as driver,
        open_admin(url) as app,  # the application's own connection, on the same loop
    ):
        assert app.loop is loop

        # Rolled back: no job, and nothing claimable.
        await app.execute("BEGIN")
        [gone] = await driver.enqueue([new_job(key="order-1")], connection=app.conn)
        assert gone.created
        assert await driver.get(gone.job_id) is None  # not visible outside the transaction
        await app.execute("ROLLBACK")
        assert await driver.get(gone.job_id) is None
        assert await driver.claim(["default"], 10, lease=30, worker_id="w") == []

        # Committed: visible, and a worker already waiting hears of it through NOTIFY.
        async with a_waiting_worker(driver) as woke:
            await app.execute("BEGIN")
            [kept] = await driver.enqueue([new_job(key="order-1")], connection=app.conn)
            await driver.send_event("paid", "{}", key="order-1", connection=app.conn)
            assert not woke.is_set()
            assert await driver.get(kept.job_id) is None
            await app.execute("COMMIT")
        record = await driver.get(kept.job_id)
        assert record is not None and record.state is JobState.READY
        assert (await driver.look_for_event("paid", key="order-1", since=None)).found is not None


async def test_a_keyed_enqueue_that_fails_part_way_commits_none_of_its_batch(
    url: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A keyed batch is several statements (the insert, then the lookup of who holds the keys it
    # skipped). The lookup made to fail: the insert before it must not stay committed.
    async with open_postgres_driver(
        url, schema=pg_schema, migrate=True, drop_schema_on_close=True
    ) as driver:
        [holder] = await driver.enqueue([new_job(key="taken")])
        monkeypatch.setitem(driver._sql.by_name, "live_key_holders", "SELECT 1 / 0, $1::text[]")
        with pytest.raises(DriverError, match="division by zero"):
            await driver.enqueue([new_job(key="fresh"), new_job(key="taken"), new_job()])
        assert [r.id for r in await driver.list_jobs()] == [holder.job_id]


async def test_connection_must_be_an_asyncpg_connection(url: str, pg_schema: str) -> None:
    async with open_postgres_driver(
        url, schema=pg_schema, migrate=True, drop_schema_on_close=True
    ) as driver:
        with pytest.raises(ConfigError, match="asyncpg connection"):
            await driver.enqueue([new_job()], connection=object())


# --- cancels, lost connections ---


async def test_a_trio_cancel_cancels_the_query_on_the_server(url: str, pg_schema: str) -> None:
    marker = f"jt_cancel_{pg_schema}"
    async with (
        open_postgres_driver(
            url, schema=pg_schema, migrate=True, drop_schema_on_close=True, pool_size=2
        ) as driver,
        open_admin(url) as admin,
    ):

        async def running() -> bool:
            n = await admin.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND query LIKE $1 "
                "AND pid <> pg_backend_pid()",
                f"%{marker}%",
            )
            return bool(n)

        async def not_running() -> bool:
            return not await running()

        scope = trio.CancelScope()
        cancelled = trio.Event()

        async def slow() -> None:
            with scope:
                await driver.bridge.run(
                    lambda conn: conn.execute(f"SELECT pg_sleep(30) /* {marker} */"),
                    what="a slow query",
                )
            cancelled.set()

        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(slow)
                await eventually(running)
                scope.cancel()
                await cancelled.wait()
                await eventually(not_running, within=2)
        assert scope.cancelled_caught
        # Both pool connections are fine afterwards, the one that ran the query included.
        for _ in range(2):
            await claim_and_complete_one(driver)


async def test_a_cancel_inside_a_transaction_rolls_it_back(url: str, pg_schema: str) -> None:
    async with (
        open_postgres_driver(
            url, schema=pg_schema, migrate=True, drop_schema_on_close=True, pool_size=1
        ) as driver,
        open_admin(url) as admin,
        # Its own connection: pg_stat_activity is read once per transaction, so the admin
        # watching the pool must not be the one holding the lock open.
        open_admin(url) as locker,
    ):
        [job] = await driver.enqueue([new_job()])
        pool_name = driver.bridge.application_name + ":pool"

        async def pool_states() -> list[str]:
            rows = await trio_asyncio.aio_as_trio(admin.conn.fetch, loop=admin.loop)(
                "SELECT state, wait_event_type FROM pg_stat_activity WHERE application_name = $1",
                pool_name,
            )
            return [f"{r['state']}/{r['wait_event_type']}" for r in rows]

        async def blocked_on_the_lock() -> bool:
            return "active/Lock" in await pool_states()

        async def idle_again() -> bool:
            # The connection a cancel cut short is closed (issue 32: never handed on), and
            # its transaction with it; a pool connection left must be idle, not in one.
            return await pool_states() in ([], ["idle/Client"])

        # The operator's cancel is a transaction (lock the row, check, update); hold it up on a
        # table lock, then cancel it from Trio while it waits.
        await locker.execute("BEGIN")
        await locker.execute(f'LOCK TABLE "{pg_schema}".jobs IN ACCESS EXCLUSIVE MODE')
        scope = trio.CancelScope()
        async with trio.open_nursery() as nursery:

            async def operator() -> None:
                with scope:
                    await driver.cancel(job.job_id)

            nursery.start_soon(operator)
            await eventually(blocked_on_the_lock)
            scope.cancel()
        assert scope.cancelled_caught
        await eventually(idle_again)  # not "idle in transaction": rolled back, not leaked
        await locker.execute("ROLLBACK")
        record = await driver.get(job.job_id)
        assert record is not None and record.state is JobState.READY
        assert (await driver.cancel(job.job_id)).state is JobState.CANCELLED


@contextlib.asynccontextmanager
async def slow_answers(url: str, delay: float) -> AsyncIterator[str]:
    """A URL to the same server through a proxy that holds each of its answers ``delay``
    seconds, so a cancel can land while a statement is on the wire."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 5432

    async def pump(source: trio.abc.Stream, sink: trio.abc.Stream, hold: float) -> None:
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            async for chunk in source:
                await trio.sleep(hold)
                await sink.send_all(chunk)
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await sink.aclose()

    async def serve(client: trio.SocketStream) -> None:
        async with (
            client,
            await trio.open_tcp_stream(host, port) as server,
            trio.open_nursery() as nursery,
        ):
            nursery.start_soon(pump, client, server, 0)
            nursery.start_soon(pump, server, client, delay)

    async with trio.open_nursery() as nursery:
        [listener] = await nursery.start(
            functools.partial(trio.serve_tcp, serve, 0, host="127.0.0.1")
        )
        netloc = f"{parts.username or 'postgres'}@127.0.0.1:{listener.socket.getsockname()[1]}"
        query = parts.query + ("&" if parts.query else "") + "sslmode=disable"
        yield urlunsplit((parts.scheme, netloc, parts.path, query, ""))
        nursery.cancel_scope.cancel()


async def test_a_cancel_while_begin_is_in_flight_costs_no_later_write(
    url: str, pg_schema: str
) -> None:
    # A cancel landing while BEGIN is on the wire: asyncpg keeps the failed transaction as the
    # connection's top one, and the server begins it while the connection still reads as idle
    # (its answer unread). Back in the pool, that connection made the next transaction a
    # SAVEPOINT inside the orphaned BEGIN: reported committed, then rolled back when the pool
    # dropped the connection.
    async with (
        open_postgres_driver(url, schema=pg_schema, migrate=True, drop_schema_on_close=True),
        slow_answers(url, 0.05) as slow_url,
        open_postgres_driver(slow_url, schema=pg_schema, pool_size=1) as driver,
    ):

        def insert(n: int) -> Callable[[Any], Awaitable[Any]]:
            return lambda conn: conn.execute(f'INSERT INTO "{pg_schema}".w VALUES ({n})')

        await driver.bridge.run(
            lambda conn: conn.execute(f'CREATE TABLE "{pg_schema}".w (n int)'), what="table"
        )
        with trio.move_on_after(0.025) as scope:  # BEGIN sent, its answer 0.05 s away
            await driver.bridge.run(insert(1), what="a write", transaction=True)
        assert scope.cancelled_caught
        await driver.bridge.run(insert(2), what="a write", transaction=True)
        kept = await driver.bridge.run(
            lambda conn: conn.fetchval(f'SELECT count(*) FROM "{pg_schema}".w'), what="count"
        )
        assert kept == 1


async def test_an_error_inside_the_block_comes_out_as_itself(url: str, pg_schema: str) -> None:
    with pytest.raises(KeyError):
        async with open_postgres_driver(
            url, schema=pg_schema, migrate=True, drop_schema_on_close=True
        ):
            raise KeyError("the application's own")


async def test_killed_pool_connections_fail_one_operation_and_lose_nothing(
    url: str, pg_schema: str
) -> None:
    async with (
        open_postgres_driver(
            url, schema=pg_schema, migrate=True, drop_schema_on_close=True, pool_size=3
        ) as driver,
        open_admin(url) as admin,
    ):
        ids = [a.job_id for a in await driver.enqueue([new_job() for _ in range(10)])]
        pool_name = driver.bridge.application_name + ":pool"
        failed: list[BaseException] = []
        started = trio.Event()

        async def mid_use() -> None:
            started.set()
            try:
                await driver.bridge.run(
                    lambda conn: conn.execute("SELECT pg_sleep(30)"), what="a slow query"
                )
            except DriverError as exc:
                failed.append(exc)

        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(mid_use)
                await started.wait()

                async def busy() -> bool:
                    n = await admin.fetchval(
                        "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 "
                        "AND query LIKE 'SELECT pg_sleep(30)%' AND state = 'active'",
                        pool_name,
                    )
                    return bool(n)

                await eventually(busy)
                killed = await admin.kill(pool_name)
                assert killed

        [error] = failed
        assert isinstance(error, DriverError) and error.retryable
        assert "lost the connection" in error.cause and error.fix

        async def all_gone() -> bool:
            return not set(killed) & set(await admin.backends(pool_name))

        await eventually(all_gone)

        # The pool replaces the dead connections; every job is still there and claimable.
        claims = await driver.claim(["default"], 20, lease=30, worker_id="w")
        assert sorted(c.job_id for c in claims) == sorted(ids)
        assert sorted(await driver.settle([Complete(c.lease) for c in claims])) == sorted(ids)
        assert len(await driver.list_jobs(state=JobState.COMPLETED)) == 10
        assert not set(killed) & set(await admin.backends(pool_name))


async def test_a_killed_listener_reconnects_and_wakes_waiters_again(
    url: str, pg_schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="jobs_trio")
    async with driver_and_admin(url, pg_schema) as (driver, admin):
        listen_name = driver.bridge.application_name + ":listen"
        await driver.wait_for_work(["default"], timeout=0)  # the first wait LISTENs
        assert driver.listening
        [old] = await admin.kill(listen_name)

        async def replaced() -> bool:
            now = await admin.backends(listen_name)
            return driver.listening and bool(now) and old not in now

        await eventually(replaced)
        assert any(getattr(r, "event", None) == "jobs.driver.reconnect" for r in caplog.records), (
            caplog.text
        )

        # The new LISTEN works: a waiter past its look for due work wakes on an enqueue.
        async with a_waiting_worker(driver):
            await driver.enqueue([new_job()])


async def _last_statement(admin: Admin, application_name: str) -> str:
    """What the named backend last ran ('' for none): LISTEN shows here, from outside."""
    query: str = await admin.fetchval(
        "SELECT coalesce(max(query), '') FROM pg_stat_activity WHERE application_name = $1",
        application_name,
    )
    return query


async def test_an_enqueue_only_driver_connects_for_listen_but_never_listens(
    url: str, pg_schema: str
) -> None:
    # Its own NOTIFY would come back to it on every enqueue, a second read per call for
    # nothing: nothing in this process waits for work.
    async with driver_and_admin(url, pg_schema) as (driver, admin):
        listen_name = driver.bridge.application_name + ":listen"
        await driver.enqueue([new_job() for _ in range(3)])
        await driver.enqueue([new_job()])
        assert not driver.listening
        # The connection is there from the open (an unreachable LISTEN target fails the open),
        # and has run nothing.
        assert len(await admin.backends(listen_name)) == 1
        assert await _last_statement(admin, listen_name) == ""


async def test_the_first_wait_for_work_listens_before_it_looks(
    url: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # LISTEN, then look, then wait: a job enqueued just after the look (before the wait
    # begins) must still wake the waiter. Looking before LISTENing would miss it.
    async with driver_and_admin(url, pg_schema) as (driver, admin):
        listen_name = driver.bridge.application_name + ":listen"
        assert not driver.listening
        original = driver._next_due_in
        listening_at_the_look: list[bool] = []

        async def look_then_enqueue(
            queues: Any, rescue_from: float | None = None, alone: bool = False
        ) -> float:
            due_in = await original(queues, rescue_from, alone)
            listening_at_the_look.append(driver.listening)
            await driver.enqueue([new_job()])  # after the look: only its NOTIFY can wake us
            return due_in

        monkeypatch.setattr(driver, "_next_due_in", look_then_enqueue)
        with trio.fail_after(20):  # the wait's own timeout (60 s) would mean a missed wake-up
            await driver.wait_for_work(["default"], timeout=60)
        assert listening_at_the_look == [True]
        assert driver.listening
        assert (await _last_statement(admin, listen_name)).startswith("LISTEN")


async def test_wait_for_work_falls_back_to_its_timeout_without_a_listener(
    url: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with open_postgres_driver(
        url, schema=pg_schema, migrate=True, drop_schema_on_close=True
    ) as driver:
        # No notification will ever come: only the timeout can end the wait.
        monkeypatch.setattr(driver._listener, "wake", lambda queue: None)
        with trio.fail_after(10):
            await driver.wait_for_work(["default"], timeout=0.2)


# --- concurrency ---


async def test_concurrent_claimers_never_share_a_job(url: str, pg_schema: str) -> None:
    async with open_postgres_driver(
        url, schema=pg_schema, migrate=True, drop_schema_on_close=True, pool_size=6
    ) as driver:
        ids = {a.job_id for a in await driver.enqueue([new_job() for _ in range(60)])}
        taken: list[str] = []

        async def claimer(name: str) -> None:
            while claims := await driver.claim(["default"], 4, lease=30, worker_id=name):
                taken.extend(c.job_id for c in claims)
                await driver.settle([Complete(c.lease) for c in claims])

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                for n in range(6):
                    nursery.start_soon(claimer, f"w{n}")
        assert sorted(taken) == sorted(ids)


async def test_racing_enqueues_of_one_key_yield_one_job(url: str, pg_schema: str) -> None:
    async with open_postgres_driver(
        url, schema=pg_schema, migrate=True, drop_schema_on_close=True, pool_size=8
    ) as driver:
        answers: list[Any] = []

        async def enqueue() -> None:
            answers.extend(await driver.enqueue([new_job(key="only-one")]))

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                for _ in range(8):
                    nursery.start_soon(enqueue)
        assert sum(a.created for a in answers) == 1
        assert len({a.job_id for a in answers}) == 1
        assert len(await driver.list_jobs()) == 1


# --- bounded waits ---


async def _session_timeouts(driver: PostgresDriver) -> tuple[str, str]:
    async def read(conn: Any) -> tuple[str, str]:
        return (
            await conn.fetchval("SHOW statement_timeout"),
            await conn.fetchval("SHOW lock_timeout"),
        )

    result: tuple[str, str] = await driver.bridge.run(read, what="reading the session")
    return result


@pytest.mark.parametrize(
    ("query", "options", "expected"),
    [
        ("", {}, ("30s", "2s")),
        ("?statement_timeout=10s&lock_timeout=250", {}, ("10s", "250ms")),
        ("?statement_timeout=10s&lock_timeout=250", {"lock_timeout": 0.5}, ("10s", "500ms")),
        ("", {"statement_timeout": 0, "lock_timeout": 1}, ("0", "1s")),
    ],
)
async def test_pooled_connections_bound_every_wait(
    url: str, pg_schema: str, query: str, options: dict[str, float], expected: tuple[str, str]
) -> None:
    async with open_postgres_driver(
        url + query, schema=pg_schema, migrate=True, drop_schema_on_close=True, **options
    ) as driver:
        assert await _session_timeouts(driver) == expected


@pytest.mark.parametrize(
    ("query", "options", "named"),
    [
        ("?lock_timeout=soon", {}, "lock_timeout='soon'"),
        ("?statement_timeout=-1s", {}, "statement_timeout='-1s'"),
        ("", {"lock_timeout": float("nan")}, "lock_timeout=nan"),
        ("", {"statement_timeout": -1}, "statement_timeout=-1"),
        ("", {"lock_timeout": "2s"}, "lock_timeout='2s'"),
        ("?statement_timeout=30d", {}, "statement_timeout='30d'"),
    ],
)
async def test_bad_timeouts_are_refused_before_connecting(
    query: str, options: dict[str, Any], named: str
) -> None:
    # Port 1: nothing listens there, so only a check made before connecting can answer.
    with pytest.raises(ConfigError, match=named):
        async with open_postgres_driver("postgresql://postgres@127.0.0.1:1/x" + query, **options):
            pass


async def three_claims_one_row_locked(driver: Any, admin: Admin, schema: str) -> list[Any]:
    """Three jobs claimed; the first one's row held FOR UPDATE by the admin's open transaction
    (an operator's session), until the test rolls it back."""
    await driver.enqueue([new_job(), new_job(), new_job()])
    claims = list(await driver.claim(["default"], 3, lease=30, worker_id="w1"))
    await admin.execute("BEGIN")
    await admin.execute(f'SELECT 1 FROM "{schema}".jobs WHERE id = $1 FOR UPDATE', claims[0].job_id)
    return claims


async def test_a_renewal_that_meets_a_row_lock_renews_every_other_run_and_says_busy(
    url: str, pg_schema: str
) -> None:
    # An operator's open `SELECT ... FOR UPDATE` on one running job's row. The renewal used to
    # wait for it until the lock timeout and then fail as a whole: one locked row cost every
    # run of the worker its renewal (a review found all 5 runs lost, run again). It must not
    # wait at all (no lock timeout here would make it wait forever), renew every other run,
    # and answer the locked one busy: still held, not extended.
    async with (
        open_postgres_driver(
            url, schema=pg_schema, migrate=True, drop_schema_on_close=True
        ) as driver,
        open_admin(url) as admin,
    ):
        claims = await three_claims_one_row_locked(driver, admin, pg_schema)
        locked, *others = claims
        before = {c.job_id: (await driver.get(c.job_id)).lease_until for c in claims}  # type: ignore[union-attr]
        with trio.fail_after(10):
            renewed = await driver.renew([c.lease for c in claims], lease=60)
        assert renewed.held == {c.token for c in others}
        assert renewed.busy == {locked.token}
        await admin.execute("ROLLBACK")
        after = {c.job_id: (await driver.get(c.job_id)).lease_until for c in claims}  # type: ignore[union-attr]
        assert after[locked.job_id] == before[locked.job_id]  # not extended
        assert all(after[c.job_id] > before[c.job_id] for c in others)
        again = await driver.renew([c.lease for c in claims], lease=30)
        assert again.held == {c.token for c in claims} and not again.busy


async def test_a_settle_past_a_locked_row_writes_the_rest_and_names_the_locked_one(
    url: str, pg_schema: str
) -> None:
    # The locked row's settlement is tried again waiting, at most the lock timeout; the rest of
    # the batch was written first, and the error says which were written and which wait.
    async with (
        open_postgres_driver(
            url, schema=pg_schema, migrate=True, drop_schema_on_close=True, lock_timeout=0.3
        ) as driver,
        open_admin(url) as admin,
    ):
        claims = await three_claims_one_row_locked(driver, admin, pg_schema)
        locked, *others = claims
        with trio.fail_after(10), pytest.raises(RowLocked) as raised:
            await driver.settle([Complete(c.lease, "1") for c in claims])
        assert raised.value.written == {c.job_id for c in others}
        assert raised.value.busy == {locked.job_id}
        assert raised.value.code == "X_LOCKED" and "pg_locks" in raised.value.fix
        states = {c.job_id: (await driver.get(c.job_id)).state for c in claims}  # type: ignore[union-attr]
        assert states == {
            locked.job_id: JobState.RUNNING,
            **{c.job_id: JobState.COMPLETED for c in others},
        }
        await admin.execute("ROLLBACK")
        assert await driver.settle([Complete(locked.lease, "1")]) == [locked.job_id]


# --- claims with fleet limits ---


async def test_a_refused_limited_claim_keeps_the_claims_already_committed(
    url: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The claim's first statement commits the unlimited jobs; the limited ones are decided in
    a transaction of their own. When that one is refused (it wrote nothing), the committed
    claims still reach the worker (else they would sit claimed till their leases lapsed, an
    attempt spent each) and the limited job stays ready, untouched. When it failed with no
    answer (it may have committed), the call raises: the worker gives back every job it does
    not hold, uncounted (hand_back_unheld), where those a lost commit took sat a lease long
    and were orphaned on a live worker (found by review)."""
    import attrs

    from jobs_trio._core.records import JobLimits

    async with open_postgres_driver(
        url, schema=pg_schema, migrate=True, drop_schema_on_close=True
    ) as driver:
        limits = JobLimits(slot_key="k", slots=1, rate_key=None, starts=0, per=0.0)
        free, limited = await driver.enqueue(
            [new_job(priority=0), attrs.evolve(new_job(priority=1), limits=limits)]
        )

        async def refused(*args: Any) -> Any:
            raise RowLocked("a lock held elsewhere (test)", fix="none")

        monkeypatch.setattr(driver, "_claim_limited", refused)
        claims = await driver.claim(["default"], 10, lease=30, worker_id="w")
        assert [c.job_id for c in claims] == [free.job_id]
        record = await driver.get(limited.job_id)
        assert record is not None and (record.state, record.attempts) == (JobState.READY, 0)

        async def lost(*args: Any) -> Any:
            raise DriverError("lost the connection (test)", fix="none")

        monkeypatch.setattr(driver, "_claim_limited", lost)
        other = (await driver.enqueue([new_job(priority=0)]))[0].job_id
        with pytest.raises(DriverError):
            await driver.claim(["default"], 10, lease=30, worker_id="w")
        given = await driver.hand_back_unheld("w", ["default"], [claims[0].token])
        assert list(given) == [other]
        monkeypatch.undo()
        again = await driver.claim(["default"], 10, lease=30, worker_id="w")
        assert (other, 1) in [(c.job_id, c.attempt) for c in again]  # its attempt given back


async def test_enqueues_refused_before_reaching_the_server_let_other_tasks_run(
    url: str, pg_schema: str
) -> None:
    # asyncpg refuses a lone surrogate while encoding, before anything is sent; the pool takes
    # a free slot without a pass of the scheduler, so each refused call must still take one.
    from jobs_trio._core.errors import ValueRefused

    other = TurnCounter()
    async with open_postgres_driver(
        url, schema=pg_schema, migrate=True, drop_schema_on_close=True
    ) as driver:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(other.run)
            [good] = await driver.enqueue([new_job()])  # the statement prepared: no wait left
            with pytest.raises(ValueRefused):
                await driver.enqueue([new_job(name="bad\ud800")])
            before = other.turns
            for _ in range(20):
                with pytest.raises(ValueRefused):
                    await driver.enqueue([new_job(name="bad\ud800")])
            # One turn of the other task per refused call; the last may land after this read
            # (Trio runs each batch of ready tasks in a random order), so 19 at least. Without
            # a checkpoint per call it was 0.
            assert other.turns - before >= 19
            nursery.cancel_scope.cancel()
        assert [job.id for job in await driver.list_jobs()] == [good.job_id]


async def test_one_job_stores_exactly_what_a_batch_stores(url: str, pg_schema: str) -> None:
    # A single job's enqueue is its own statement (enqueue_one, scalars); a batch is another
    # (unnest). The same job through each must store the same row, refuse the same values and
    # answer a live key's holder the same way.
    from jobs_trio._core.errors import ValueRefused
    from jobs_trio._core.records import JobLimits, NewJob, new_job_id

    hostile = "\x1b[31mred\x1b[0m 'q' \"d\" {a,b} NULL \\N é 🐍"

    def job(**changes: Any) -> NewJob:
        fields: dict[str, Any] = {
            "job_id": new_job_id(),
            "name": f"t.{hostile}",
            "queue": "q-é",
            "payload": json.dumps({"text": hostile, "deep": [[[1]]]}),
            "max_attempts": 2147483647,
            "priority": -2147483648,
            "delay": 30.5,
            "key": None,
            "limits": JobLimits(slot_key=f"s:{hostile}", slots=2, rate_key="r", starts=3, per=1.5),
            "context": json.dumps({"tenant": hostile}),
        }
        fields.update(changes)
        return NewJob(**fields)

    columns = (
        "name, queue, state, payload, priority, attempts, max_attempts, run_at - created_at,"
        " key, slot_key, slots, rate_key, starts, per, context"
    )
    async with (
        open_postgres_driver(url, schema=pg_schema, migrate=True, drop_schema_on_close=True) as d,
        open_admin(url) as admin,
    ):

        async def row(job_id: str) -> tuple[Any, ...]:
            found = await trio_asyncio.aio_as_trio(admin.conn.fetchrow, loop=admin.loop)(
                f'SELECT {columns} FROM "{pg_schema}".jobs WHERE id = $1', job_id
            )
            return tuple(found)

        alone, in_batch = job(), job()
        await d.enqueue([alone])
        await d.enqueue([in_batch, job(name="other")])
        assert await row(alone.job_id) == await row(in_batch.job_id)

        # A key a live job holds: both forms answer the holder, and write nothing.
        [holder] = await d.enqueue([job(key=hostile)])
        [one] = await d.enqueue([job(key=hostile)])
        [two, _] = await d.enqueue([job(key=hostile), job()])
        assert (one.job_id, one.created) == (two.job_id, two.created) == (holder.job_id, False)

        # Values the server or the encoder refuses: the same error, nothing stored.
        stored = await admin.fetchval(f'SELECT count(*) FROM "{pg_schema}".jobs')
        for bad in (
            {"name": "nul \x00 in text"},
            {"name": "lone \ud800"},
            {"priority": 2147483648},
            {"limits": JobLimits(slot_key="s", slots=2**31)},
        ):
            with pytest.raises(ValueRefused):
                await d.enqueue([job(**bad)])
            with pytest.raises(ValueRefused):
                await d.enqueue([job(**bad), job()])
        assert await admin.fetchval(f'SELECT count(*) FROM "{pg_schema}".jobs') == stored


@contextlib.asynccontextmanager
async def freezable(url: str) -> AsyncIterator[tuple[str, Callable[[], None]]]:
    """A URL to the same server through a proxy, and a call that freezes every connection
    open at that moment for good (kept open, nothing forwarded either way: a failover that
    moved the address, a stuck proxy); connections made after pass as usual."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 5432
    generation = 0

    async def pump(source: trio.abc.Stream, sink: trio.abc.Stream, born: int) -> None:
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            async for chunk in source:
                if generation != born:
                    await trio.sleep_forever()  # frozen: nothing goes through, ever
                await sink.send_all(chunk)

    async def serve(client: trio.SocketStream) -> None:
        born = generation
        async with (
            client,
            await trio.open_tcp_stream(host, port) as server,
            trio.open_nursery() as nursery,
        ):
            nursery.start_soon(pump, client, server, born)
            nursery.start_soon(pump, server, client, born)

    def freeze() -> None:
        nonlocal generation
        generation += 1

    async with trio.open_nursery() as nursery:
        [listener] = await nursery.start(
            functools.partial(trio.serve_tcp, serve, 0, host="127.0.0.1")
        )
        netloc = f"{parts.username or 'postgres'}@127.0.0.1:{listener.socket.getsockname()[1]}"
        query = parts.query + ("&" if parts.query else "") + "sslmode=disable"
        yield urlunsplit((parts.scheme, netloc, parts.path, query, "")), freeze
        nursery.cancel_scope.cancel()


async def test_an_operation_nothing_answers_fails_retryably_and_the_next_gets_a_new_connection(
    url: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A connection whose packets go nowhere is never heard by the server, so its
    # statement_timeout never fires: the operation waited for TCP to give up (~15 minutes of a
    # worker that ran nothing and said nothing, in a review). Bounded now by statement_timeout
    # and a margin (shortened here), the connection dropped.
    monkeypatch.setattr(postgres_bridge, "ANSWER_MARGIN_SECONDS", 1.0)
    async with (
        open_postgres_driver(url, schema=pg_schema, migrate=True, drop_schema_on_close=True),
        freezable(url) as (proxied, freeze),
        open_postgres_driver(
            proxied, schema=pg_schema, pool_size=1, statement_timeout=0.5
        ) as driver,
    ):
        [job] = await driver.enqueue([new_job()])  # the one pooled connection, open
        freeze()
        with trio.fail_after(20), pytest.raises(DriverError, match="no answer from PostgreSQL"):
            await driver.get(job.job_id)
        with trio.fail_after(20):  # a new connection, through the proxy, which passes it
            record = await driver.get(job.job_id)
        assert record is not None and record.state is JobState.READY


async def test_a_lost_answer_to_the_claim_after_a_rescue_gives_its_jobs_back_at_once(
    url: str, pg_schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    # A claim that rescues lapsed jobs hands them back and claims nothing (its snapshot is
    # older); the driver then claims them. When that second claim committed and its answer was
    # lost, the driver logged it and answered nothing: the jobs sat running under this live
    # worker a lease long, then were orphaned on it, a second orphaning for nothing (a suspect
    # dead-lettered X_KILLED_WORKER). Raised, the worker gives back what it does not hold.
    import jobs_trio

    registry = jobs_trio.Registry()
    ran: list[int] = []

    @registry.job("rescued")
    async def rescued(ctx: Any, payload: int) -> None:
        ran.append(ctx.attempt)

    caplog.set_level(logging.INFO, logger="jobs_trio")
    async with open_postgres_driver(
        url, schema=pg_schema, migrate=True, drop_schema_on_close=True
    ) as driver:
        job_id = await rescued.enqueue(driver, 1)
        assert await driver.claim(["default"], 1, lease=0.2, worker_id="died")
        await trio.sleep(0.3)  # its lease lapsed: the worker below rescues it
        real_claim, lost = driver.claim, []

        async def claim(*args: Any, **kw: Any) -> Any:
            claims = await real_claim(*args, **kw)
            if kw.get("rescue") is False and claims and not lost:  # the claim after the rescue
                lost.append(claims)
                raise DriverError("the connection was lost (test)", fix="retry")
            return claims

        driver.claim = claim  # type: ignore[method-assign]
        with trio.fail_after(20):
            async with jobs_trio.open_worker(
                driver, registry, lease=10, stats_interval=None, drain_on_shutdown=False
            ):
                while not ran:
                    await trio.sleep(0.05)
        record = await driver.get(job_id)
    assert lost and [c.job_id for c in lost[0]] == [job_id]
    assert record is not None and record.state is JobState.COMPLETED
    assert record.orphans == 1  # its first worker's death, and nothing for this one
    assert "jobs.worker.claim-answer-lost" in [getattr(r, "event", "") for r in caplog.records]
