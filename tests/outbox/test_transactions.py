# Enqueue inside the application's current transaction, on both application databases: the
# application's row and the job commit together, roll back together, and a waiting worker is
# woken by the commit (not before it). Also the outbox write in that transaction.
from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

import jobs_trio
import jobs_trio.driver
from jobs_trio._core.errors import ConfigError
from jobs_trio.drivers._open_driver import open_driver
from jobs_trio.drivers.sqlite import SqliteDriver, open_sqlite_driver
from tests.conftest import require_postgres

registry = jobs_trio.Registry()


@registry.job("orders.confirm")
async def confirm(ctx: jobs_trio.JobContext, payload: dict[str, Any]) -> None:
    pass


class Boom(Exception):
    pass


async def place_order(tx: jobs_trio.Transaction, target: Any, order: int, sql: str) -> str:
    """An application's request handler: its row, then an enqueue three calls deep that never
    mentions a connection."""
    await tx.execute(sql, order)

    async def deep() -> str:
        return await confirm.enqueue(target, {"order": order}, key=f"order:{order}")

    return await deep()


# --- SQLite: the application's own sqlite3 connection, and the driver's own ---


@contextlib.asynccontextmanager
async def sqlite_app(tmp_path: Path) -> AsyncIterator[tuple[SqliteDriver, sqlite3.Connection]]:
    async with open_sqlite_driver(f"sqlite:///{tmp_path / 'app.db'}", poll_interval=1000) as d:
        conn = sqlite3.connect(d.path, check_same_thread=False)
        conn.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY)")
        conn.commit()
        try:
            yield d, conn
        finally:
            conn.close()


def orders_in(path: str) -> list[int]:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return [row[0] for row in conn.execute("SELECT id FROM orders ORDER BY id")]


SQLITE_INSERT = "INSERT INTO orders (id) VALUES (?)"


async def test_sqlite_rollback_keeps_neither_the_row_nor_the_job(tmp_path: Path) -> None:
    async with sqlite_app(tmp_path) as (driver, conn):
        with pytest.raises(Boom):
            async with jobs_trio.transaction(conn) as tx:
                job_id = await place_order(tx, driver, 1, SQLITE_INSERT)
                raise Boom
        assert orders_in(driver.path) == []
        assert await driver.get(job_id) is None
        assert not conn.in_transaction  # the connection is usable again


async def test_sqlite_commit_stores_both_and_wakes_a_waiting_worker_at_the_commit(
    tmp_path: Path,
) -> None:
    async with sqlite_app(tmp_path) as (driver, conn):
        woke_after_commit: list[bool] = []

        async def waiting_worker() -> None:
            # poll_interval=1000: only a wake-up ends this wait within the test's deadline; and
            # a wake-up is only worth its name if the job is there to claim when it arrives.
            await driver.wait_for_work(["default"], timeout=1000)
            woke_after_commit.append(bool(await driver.list_jobs()))

        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(waiting_worker)
                await trio.testing.wait_all_tasks_blocked()
                async with jobs_trio.transaction(conn) as tx:
                    job_id = await place_order(tx, driver, 7, SQLITE_INSERT)
                    # A wake-up sent with the enqueue would have run the waiter by now.
                    await trio.testing.wait_all_tasks_blocked()
                    assert woke_after_commit == []
                    # Not committed: another connection sees neither the row nor the job.
                    assert orders_in(driver.path) == []
        assert woke_after_commit == [True]
        assert orders_in(driver.path) == [7]
        record = await driver.get(job_id)
        assert record is not None and record.key == "order:7"
        assert len(await driver.list_jobs()) == 1


async def test_sqlite_the_drivers_own_connection_as_the_transaction(tmp_path: Path) -> None:
    async with sqlite_app(tmp_path) as (driver, _):
        with pytest.raises(Boom):
            async with jobs_trio.transaction(driver) as tx:
                await place_order(tx, driver, 1, SQLITE_INSERT)
                raise Boom
        async with jobs_trio.transaction(driver) as tx:
            job_id = await place_order(tx, driver, 2, SQLITE_INSERT)
        assert orders_in(driver.path) == [2]
        assert [r.id for r in await driver.list_jobs()] == [job_id]


@pytest.mark.parametrize("own_connection", [True, False])
async def test_sqlite_an_event_sent_in_the_block_joins_it_and_wakes_the_suspended_job(
    tmp_path: Path, own_connection: bool
) -> None:
    # Sent on the driver's own connection while the block's task held it, send_event raised
    # "attempt to re-acquire an already held Lock" and took the whole block down with it.
    async with sqlite_app(tmp_path) as (driver, conn):
        target: Any = driver if own_connection else conn
        job_id = await confirm.enqueue(driver, {"order": 0})
        [claim] = await driver.claim(["default"], 1, lease=30, worker_id="w")
        await driver.settle([jobs_trio.driver.Suspend(claim.lease, 3600, event="order.paid")])
        with pytest.raises(Boom):
            async with jobs_trio.transaction(target) as tx:
                await jobs_trio.send_event(driver, "order.paid", {"order": 1}, key="1")
                raise Boom
        assert (await driver.look_for_event("order.paid", key=None, since=None)).found is None
        assert (await driver.get(job_id)).state is jobs_trio.JobState.SUSPENDED  # type: ignore[union-attr]
        with trio.fail_after(10):
            async with jobs_trio.transaction(target) as tx:
                await tx.execute(SQLITE_INSERT, 2)
                event_id = await jobs_trio.send_event(driver, "order.paid", {"order": 2}, key="2")
        found = (await driver.look_for_event("order.paid", key="2", since=None)).found
        assert found is not None and found.id == event_id and orders_in(driver.path) == [2]
        assert (await driver.get(job_id)).state is jobs_trio.JobState.READY  # type: ignore[union-attr]


async def test_sqlite_a_connection_to_another_file_is_refused(tmp_path: Path) -> None:
    async with sqlite_app(tmp_path) as (driver, _):
        other = sqlite3.connect(tmp_path / "other.db", check_same_thread=False)
        other.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY)")
        with pytest.raises(ConfigError, match="not to the driver's file"):
            async with jobs_trio.transaction(other) as tx:
                await place_order(tx, driver, 1, SQLITE_INSERT)
        other.close()
        assert await driver.list_jobs() == []


# --- the outbox, in the application's SQLite database ---


async def test_outbox_in_sqlite_follows_the_transaction_and_the_relay_moves_it_once(
    tmp_path: Path,
) -> None:
    async with (
        sqlite_app(tmp_path) as (app_db, conn),
        open_driver("memory://") as store,
    ):
        outbox = jobs_trio.Outbox(app_db)
        with pytest.raises(Boom):
            async with jobs_trio.transaction(conn) as tx:
                await place_order(tx, outbox, 1, SQLITE_INSERT)
                raise Boom
        async with jobs_trio.transaction(conn) as tx:
            job_id = await place_order(tx, outbox, 2, SQLITE_INSERT)
        assert (await app_db.outbox_stats()).pending == 1
        assert await store.list_jobs() == []
        relay = jobs_trio.Relay(outbox, store)
        assert await relay._one_pass() == 1
        assert [r.id for r in await store.list_jobs()] == [job_id]
        assert (await app_db.outbox_stats()).pending == 0


# --- PostgreSQL: the application's asyncpg connection ---


trio_asyncio = pytest.importorskip("trio_asyncio")
asyncpg = pytest.importorskip("asyncpg")


@contextlib.asynccontextmanager
async def postgres_app(schema: str) -> AsyncIterator[tuple[jobs_trio.Driver, Any, str]]:
    url = require_postgres()
    async with open_driver(url, schema=schema, migrate=True, drop_schema_on_close=True) as d:
        loop = d.loop  # type: ignore[attr-defined]
        conn = await trio_asyncio.aio_as_trio(asyncpg.connect, loop=loop)(url)
        run: Callable[..., Awaitable[Any]] = trio_asyncio.aio_as_trio(conn.execute, loop=loop)
        await run(f'CREATE TABLE "{schema}".orders (id int PRIMARY KEY)')
        try:
            yield d, conn, f'INSERT INTO "{schema}".orders (id) VALUES ($1)'
        finally:
            with trio.CancelScope(shield=True):
                await trio_asyncio.aio_as_trio(conn.close, loop=loop)()


async def pg_orders(conn: Any, loop: Any, schema: str) -> list[int]:
    rows = await trio_asyncio.aio_as_trio(conn.fetch, loop=loop)(
        f'SELECT id FROM "{schema}".orders ORDER BY id'
    )
    return [row["id"] for row in rows]


@pytest.mark.postgres
async def test_postgres_rollback_commit_and_exception(pg_schema: str) -> None:
    async with postgres_app(pg_schema) as (driver, conn, insert):
        loop = driver.loop  # type: ignore[attr-defined]
        with pytest.raises(Boom):
            async with jobs_trio.transaction(conn) as tx:
                gone = await place_order(tx, driver, 1, insert)
                raise Boom
        assert await driver.get(gone) is None
        assert await pg_orders(conn, loop, pg_schema) == []
        assert not conn.is_in_transaction()

        woke: list[bool] = []

        async def waiting_worker() -> None:
            await driver.wait_for_work(["default"], timeout=1000)
            woke.append(bool(await driver.list_jobs()))  # the job is there when it wakes

        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(waiting_worker)
                await trio.testing.wait_all_tasks_blocked()
                async with jobs_trio.transaction(conn) as tx:
                    kept = await place_order(tx, driver, 2, insert)
                    assert await driver.get(kept) is None  # not visible before the commit
        assert woke == [True]
        assert await pg_orders(conn, loop, pg_schema) == [2]
        assert [r.id for r in await driver.list_jobs()] == [kept]


@pytest.mark.postgres
async def test_postgres_outbox_follows_the_transaction_and_the_relay_moves_it_once(
    pg_schema: str, tmp_path: Path
) -> None:
    async with (
        postgres_app(pg_schema) as (app_db, conn, insert),
        open_sqlite_driver(f"sqlite:///{tmp_path / 'jobs.db'}") as store,
    ):
        outbox = jobs_trio.Outbox(app_db)
        with pytest.raises(Boom):
            async with jobs_trio.transaction(conn) as tx:
                await place_order(tx, outbox, 1, insert)
                raise Boom
        async with jobs_trio.transaction(conn) as tx:
            job_id = await place_order(tx, outbox, 2, insert)
        assert (await app_db.outbox_stats()).pending == 1
        assert await app_db.list_jobs() == []  # into the outbox, not the app database's jobs
        relay = jobs_trio.Relay(outbox, store)
        assert await relay._one_pass() == 1
        [record] = await store.list_jobs()
        assert (record.id, record.key) == (job_id, "order:2")
        assert (await app_db.outbox_stats()).pending == 0


# --- PostgreSQL: the driver's own pool (jobs_trio.transaction(driver)) ---


async def connections_named(driver: Any, schema: str) -> int:
    """How many server sessions the driver's pool holds open right now."""
    async with jobs_trio.transaction(driver) as tx:
        found: int = await tx.fetchval(
            "SELECT count(*)::int FROM pg_stat_activity WHERE application_name = $1",
            f"jobs_trio:{schema}:pool",
        )
    return found


@pytest.mark.postgres
async def test_postgres_the_drivers_pool_holds_the_block_and_every_enqueue_joins_it(
    pg_schema: str,
) -> None:
    url = require_postgres()
    async with open_driver(url, schema=pg_schema, migrate=True, drop_schema_on_close=True) as d:
        orders = f'"{pg_schema}".orders'
        async with jobs_trio.transaction(d) as tx:
            await tx.execute(f"CREATE TABLE {orders} (id int PRIMARY KEY, item text)")
        job_id = await confirm.enqueue(d, {"order": 0})
        [claim] = await d.claim(["default"], 1, lease=30, worker_id="w")
        await d.settle([jobs_trio.driver.Suspend(claim.lease, 3600, event="order.paid")])

        with pytest.raises(Boom):
            async with jobs_trio.transaction(d) as tx:
                gone = await place_order(tx, d, 1, f"INSERT INTO {orders} (id) VALUES ($1)")
                await jobs_trio.send_event(d, "order.paid", {"order": 1})
                raise Boom
        assert await d.get(gone) is None
        assert (await d.get(job_id)).state is jobs_trio.JobState.SUSPENDED  # type: ignore[union-attr]

        woke: list[bool] = []

        async def waiting_worker() -> None:
            await d.wait_for_work(["default"], timeout=1000)
            woke.append(bool(await d.list_jobs(state=jobs_trio.JobState.READY)))

        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(waiting_worker)
                await trio.testing.wait_all_tasks_blocked()
                async with jobs_trio.transaction(d) as tx:
                    kept = await place_order(tx, d, 2, f"INSERT INTO {orders} (id) VALUES ($1)")
                    await jobs_trio.send_event(d, "order.paid", {"order": 2})
                    assert await d.get(kept) is None  # another connection: not committed yet
                    assert await tx.fetchval(f"SELECT count(*) FROM {orders}") == 1
        assert woke == [True]  # woken by the commit, with the job there to claim
        async with jobs_trio.transaction(d) as tx:
            row = await tx.fetchrow(f"SELECT id, item FROM {orders}")
            assert (row["id"], row["item"]) == (2, None)
            assert await tx.fetch(f"SELECT id FROM {orders} WHERE id = $1", 99) == []
            assert await tx.fetchrow(f"SELECT id FROM {orders} WHERE id = $1", 99) is None
            assert await tx.fetchval(f"SELECT id FROM {orders} WHERE id = $1", 99) is None
        assert (await d.get(kept)) is not None
        assert (await d.get(job_id)).state is jobs_trio.JobState.READY  # type: ignore[union-attr]


@pytest.mark.postgres
async def test_postgres_a_cancelled_block_rolls_back_and_hands_its_connection_back(
    pg_schema: str,
) -> None:
    url = require_postgres()
    async with open_driver(
        url, schema=pg_schema, migrate=True, drop_schema_on_close=True, pool_size=3
    ) as d:
        async with jobs_trio.transaction(d) as tx:
            await tx.execute(f'CREATE TABLE "{pg_schema}".orders (id int PRIMARY KEY)')
        insert = f'INSERT INTO "{pg_schema}".orders (id) VALUES ($1)'
        with trio.fail_after(30):
            for order in range(6):  # more blocks than the pool has connections
                with trio.move_on_after(0.2) as cut:
                    async with jobs_trio.transaction(d) as tx:
                        await place_order(tx, d, order, insert)
                        await tx.execute("SELECT pg_sleep(30)")  # cancelled on the server
                assert cut.cancelled_caught
            async with jobs_trio.transaction(d) as tx:
                assert await tx.fetchval(f'SELECT count(*) FROM "{pg_schema}".orders') == 0
            assert await d.list_jobs() == []
            # Nothing leaked: every block's connection came back (or was replaced).
            assert await connections_named(d, pg_schema) <= 3


@pytest.mark.postgres
async def test_postgres_blocks_wait_for_a_connection_and_leave_the_last_to_the_driver(
    pg_schema: str,
) -> None:
    url = require_postgres()
    async with open_driver(
        url, schema=pg_schema, migrate=True, drop_schema_on_close=True, pool_size=2
    ) as d:
        release, second_in = trio.Event(), trio.Event()

        async def first() -> None:
            async with jobs_trio.transaction(d) as tx:
                await tx.execute("SELECT 1")
                await release.wait()

        async def second() -> None:
            async with jobs_trio.transaction(d) as tx:
                await tx.execute("SELECT 1")
                second_in.set()

        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(first)
                await trio.testing.wait_all_tasks_blocked()
                nursery.start_soon(second)
                await trio.testing.wait_all_tasks_blocked()
                assert not second_in.is_set()  # one block at a time with pool_size=2 ...
                await confirm.enqueue(d, {"order": 1})  # ... and the driver still has one
                assert len(await d.list_jobs()) == 1
                release.set()
                await second_in.wait()


@pytest.mark.postgres
async def test_postgres_an_asyncpg_pool_of_the_application(pg_schema: str) -> None:
    async with postgres_app(pg_schema) as (driver, _, insert):
        loop = driver.loop  # type: ignore[attr-defined]
        pool = await trio_asyncio.aio_as_trio(asyncpg.create_pool, loop=loop)(
            require_postgres(), min_size=1, max_size=1
        )
        try:
            with pytest.raises(Boom):
                async with jobs_trio.transaction(pool) as tx:
                    gone = await place_order(tx, driver, 1, insert)
                    raise Boom
            assert await driver.get(gone) is None
            with trio.fail_after(10):  # max_size=1: the first block's connection came back
                async with jobs_trio.transaction(pool) as tx:
                    kept = await place_order(tx, driver, 2, insert)
                    assert await tx.fetchval(f'SELECT count(*) FROM "{pg_schema}".orders') == 1
            assert [r.id for r in await driver.list_jobs()] == [kept]
        finally:
            with trio.CancelScope(shield=True):
                await trio_asyncio.aio_as_trio(pool.close, loop=loop)()


@pytest.mark.postgres
async def test_postgres_a_connection_of_another_loop_is_refused(pg_schema: str) -> None:
    async with postgres_app(pg_schema) as (driver, _, insert):
        async with trio_asyncio.open_loop() as other_loop:
            assert other_loop is not driver.loop  # type: ignore[attr-defined]
            conn = await trio_asyncio.aio_as_trio(asyncpg.connect, loop=other_loop)(
                require_postgres()
            )
            try:
                with pytest.raises(ConfigError, match="another trio-asyncio loop"):
                    async with jobs_trio.transaction(conn) as tx:
                        await place_order(tx, driver, 1, insert)
            finally:
                with trio.CancelScope(shield=True):
                    await trio_asyncio.aio_as_trio(conn.close, loop=other_loop)()
        assert await driver.list_jobs() == []
