# A transaction of the PostgreSQL driver's own pool left idle (its process stopped, or its loop
# blocked, between two statements) is ended by the server before the locks it holds cost anyone
# else a statement: a review found one stopped worker stalling the fleet's cron and failing
# other workers' renewals for as long as it stayed stopped. The application's own transaction
# (jobs_trio.transaction) may idle as long as it likes.
from __future__ import annotations

from typing import Any

import pytest
import trio

import jobs_trio
from jobs_trio import Registry
from jobs_trio.driver import Driver

pytestmark = pytest.mark.postgres

asyncpg = pytest.importorskip("asyncpg")

# The pool's bound is 1 s, the lock timeout 2 s; this idles past both.
IDLE = 3.0


async def _job(driver: Driver) -> str:
    registry = Registry()

    @registry.job("idle.row")
    async def row(ctx: object, payload: Any) -> None: ...

    return str(await row.enqueue(driver))


async def test_the_pools_transaction_left_idle_is_ended_and_its_locks_freed(
    pg_driver: Driver, pg_schema: str
) -> None:
    driver, schema = pg_driver, pg_schema
    job_id = await _job(driver)
    bridge: Any = driver.bridge  # type: ignore[attr-defined]

    async def lock_the_row_and_idle(conn: Any) -> str:
        # A driver transaction's first statement, then nothing: as a process stopped between
        # two statements of a claim leaves it.
        await conn.execute("BEGIN")
        await conn.execute(f"SELECT 1 FROM {schema}.jobs WHERE id = $1 FOR UPDATE", job_id)
        await trio_asyncio_sleep(IDLE)
        try:
            await conn.execute("COMMIT")
        except Exception as exc:  # the server ended the session meanwhile
            return type(exc).__name__
        return "committed"

    async def another_session_updates_the_row() -> str:
        # What another worker's renewal or settle does, under the pool's lock timeout.
        await trio.sleep(0.3)  # the row is locked by now (a real wait: real server, real time)

        async def update(conn: Any) -> str:
            return str(
                await conn.execute(
                    f"UPDATE {schema}.jobs SET updated_at = updated_at WHERE id = $1", job_id
                )
            )

        return str(await bridge.run(update, what="test update"))

    answers: dict[str, str] = {}
    async with trio.open_nursery() as nursery:

        async def held() -> None:
            async with bridge.held() as conn:
                answers["idle"] = await bridge.run_checked_out(
                    conn, lock_the_row_and_idle, what="test idle", bounded=False
                )

        async def other() -> None:
            answers["other"] = await another_session_updates_the_row()

        nursery.start_soon(held)
        nursery.start_soon(other)
    assert answers["other"] == "UPDATE 1", answers
    assert answers["idle"] != "committed", answers


async def test_the_applications_transaction_may_idle_past_the_pools_bound(
    pg_driver: Driver, pg_schema: str
) -> None:
    driver, schema = pg_driver, pg_schema
    registry = Registry()

    @registry.job("idle.app")
    async def app(ctx: object, payload: Any) -> None: ...

    async with jobs_trio.transaction(driver) as tx:
        await tx.execute(f"SELECT count(*) FROM {schema}.jobs")
        await trio.sleep(IDLE)  # the application waits on something of its own
        job_id = await app.enqueue(driver, connection=tx)
    assert await driver.get(job_id) is not None


async def trio_asyncio_sleep(seconds: float) -> None:
    import asyncio

    await asyncio.sleep(seconds)
