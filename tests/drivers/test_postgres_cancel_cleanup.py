# Cancels that reach PostgreSQL mid-operation, against a real server: a row lock inside the
# driver's transaction, a killed backend, an application's own connection. Apart from
# test_postgres_driver.py because each holds a lock or a backend from a second connection.
from __future__ import annotations

from typing import Any

import pytest
import trio

from jobs_trio._core.errors import DriverError
from jobs_trio.testing.conformance.helpers import new_job
from tests.conftest import require_postgres
from tests.drivers.test_postgres_driver import eventually, open_admin

pytestmark = pytest.mark.postgres
trio_asyncio = pytest.importorskip("trio_asyncio")
pytest.importorskip("asyncpg")

from jobs_trio.drivers.postgres import open_postgres_driver  # noqa: E402


@pytest.fixture
def url() -> str:
    return require_postgres()


async def _states(admin: Any, name: str) -> list[str]:
    rows = await trio_asyncio.aio_as_trio(admin.conn.fetch, loop=admin.loop)(
        "SELECT state, wait_event_type FROM pg_stat_activity WHERE application_name = $1", name
    )
    return sorted(f"{r['state']}/{r['wait_event_type']}" for r in rows)


@pytest.mark.parametrize("how", ["cancel", "deadline", "double"])
async def test_cancel_on_a_row_lock_inside_a_transaction(
    url: str, pg_schema: str, how: str
) -> None:
    async with (
        open_postgres_driver(
            url, schema=pg_schema, migrate=True, drop_schema_on_close=True, pool_size=1
        ) as driver,
        open_admin(url) as admin,
        open_admin(url) as locker,
    ):
        pool = driver.bridge.application_name + ":pool"
        await admin.execute(f'CREATE TABLE "{pg_schema}".t (id int primary key)')
        await admin.execute(f'CREATE TABLE "{pg_schema}".w (id int)')
        await admin.execute(f'INSERT INTO "{pg_schema}".t VALUES (1)')
        await locker.execute("BEGIN")
        await locker.execute(f'SELECT * FROM "{pg_schema}".t FOR UPDATE')

        async def op(conn: Any) -> None:
            await conn.execute(f'INSERT INTO "{pg_schema}".w VALUES (1)')
            await conn.execute(f'SELECT * FROM "{pg_schema}".t FOR UPDATE')

        outer = trio.CancelScope()
        inner = trio.CancelScope()
        got: list[object] = []

        async def runner() -> None:
            with outer, inner:
                if how == "deadline":
                    inner.deadline = trio.current_time() + 0.5
                try:
                    await driver.bridge.run(op, what="t", transaction=True)
                except BaseException as exc:
                    got.append(type(exc).__name__)
                    raise

        with trio.fail_after(15):
            async with trio.open_nursery() as n:
                n.start_soon(runner)
                await eventually(lambda: _lockwait(admin, pool))
                if how in ("cancel", "double"):
                    inner.cancel()
                if how == "double":
                    await trio.sleep(0)
                    outer.cancel()
        assert got == ["Cancelled"], got
        await eventually(lambda: _idle(admin, pool))
        await locker.execute("ROLLBACK")
        assert await admin.fetchval(f'SELECT count(*) FROM "{pg_schema}".w') == 0
        assert await driver.bridge.run(lambda c: c.fetchval("SELECT 7"), what="x") == 7


async def _lockwait(admin: Any, name: str) -> bool:
    return "active/Lock" in await _states(admin, name)


async def _idle(admin: Any, name: str) -> bool:
    return (await _states(admin, name)) in (["idle/Client"], [])


async def test_a_backend_killed_mid_transaction_is_one_driver_error(
    url: str, pg_schema: str
) -> None:
    async with (
        open_postgres_driver(
            url, schema=pg_schema, migrate=True, drop_schema_on_close=True, pool_size=1
        ) as driver,
        open_admin(url) as admin,
    ):
        pool = driver.bridge.application_name + ":pool"
        with trio.fail_after(15):
            async with trio.open_nursery() as n:
                errs: list[DriverError] = []

                async def runner() -> None:
                    try:
                        await driver.bridge.run(
                            lambda c: c.execute("SELECT pg_sleep(20)"), what="t", transaction=True
                        )
                    except DriverError as exc:
                        errs.append(exc)

                n.start_soon(runner)
                await eventually(lambda: _active(admin, pool))
                await admin.kill(pool)
        assert len(errs) == 1
        assert await driver.bridge.run(lambda c: c.fetchval("SELECT 7"), what="x") == 7


async def _active(admin: Any, name: str) -> bool:
    return "active/Timeout" in await _states(admin, name)


@pytest.mark.parametrize("in_tx", [True, False])
async def test_cancel_on_the_applications_connection(url: str, pg_schema: str, in_tx: bool) -> None:
    async with (
        trio_asyncio.open_loop(),
        open_postgres_driver(
            url, schema=pg_schema, migrate=True, drop_schema_on_close=True
        ) as driver,
        open_admin(url) as app,
        open_admin(url) as admin,
        open_admin(url) as locker,
    ):
        await app.execute(f'CREATE TABLE "{pg_schema}".mine (id int)')
        await locker.execute("BEGIN")
        await locker.execute(f'LOCK TABLE "{pg_schema}".jobs IN ACCESS EXCLUSIVE MODE')
        app_pid = await app.fetchval("SELECT pg_backend_pid()")
        if in_tx:
            await app.execute("BEGIN")
            await app.execute(f'INSERT INTO "{pg_schema}".mine VALUES (1)')
        scope = trio.CancelScope()

        async def blocked() -> bool:
            n = await admin.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE pid=$1 AND wait_event_type='Lock'",
                app_pid,
            )
            return bool(n)

        with trio.fail_after(15):
            async with trio.open_nursery() as n:

                async def runner() -> None:
                    with scope:
                        await driver.enqueue([new_job()], connection=app.conn)

                n.start_soon(runner)
                await eventually(blocked)
                scope.cancel()
        assert scope.cancelled_caught
        await locker.execute("ROLLBACK")
        # The application's connection and its own transaction are still usable.
        assert await app.fetchval("SELECT 5") == 5
        if in_tx:
            assert await app.fetchval(f'SELECT count(*) FROM "{pg_schema}".mine') == 1
            await app.execute("COMMIT")
        assert not app.conn.is_in_transaction()
        assert await admin.fetchval(f'SELECT count(*) FROM "{pg_schema}".jobs') == 0
