# A pause racing claims on PostgreSQL (DESIGN invariant 12: a paused queue starts nothing
# anywhere until resumed): a claim is ordered before a pause or after it, never beside it. The
# pause waits for a claim that read the pauses before it; a claim that reads them while a pause
# is being written waits for its commit and then sees it. Apart from the conformance suite
# because only PostgreSQL runs claims and a pause side by side, in separate transactions.
from __future__ import annotations

import pytest
import trio

from jobs_trio._core.records import JobState
from jobs_trio.testing.conformance.helpers import enqueue_one
from tests.conftest import require_postgres

pytestmark = pytest.mark.postgres

trio_asyncio = pytest.importorskip("trio_asyncio")

from tests.drivers.test_postgres_driver import Admin, driver_and_admin, eventually  # noqa: E402


async def _waits_for_the_pauses(admin: Admin, schema: str) -> bool:
    """Whether a session waits for a lock on this schema's queue_pauses (the other tests on the
    server wait on tables of their own)."""
    waiting = await admin.fetchval(
        "SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = to_regclass($1)",
        f'"{schema}".queue_pauses',
    )
    return bool(waiting)


async def test_a_pause_waits_for_a_claim_that_read_the_pauses_before_it(pg_schema: str) -> None:
    url = require_postgres()
    async with driver_and_admin(url, pg_schema, lock_timeout=10) as (driver, admin):
        # A claim in flight: its transaction has read the pauses (as the claim statement does)
        # and has not committed.
        await admin.execute("BEGIN")
        await admin.fetchval(f'SELECT count(*) FROM "{pg_schema}".queue_pauses')
        paused = trio.Event()

        async def pause() -> None:
            await driver.pause_queue("a")
            paused.set()

        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(pause)
                await eventually(lambda: _waits_for_the_pauses(admin, pg_schema))
                assert not paused.is_set()  # the claim in flight ends first
                await admin.execute("COMMIT")
        assert [p.queue for p in await driver.queue_pauses()] == ["a"]


async def test_a_claim_during_a_pause_waits_for_it_and_then_sees_it(pg_schema: str) -> None:
    url = require_postgres()
    async with driver_and_admin(url, pg_schema, lock_timeout=10) as (driver, admin):
        in_a = await enqueue_one(driver, queue="a")
        in_b = await enqueue_one(driver, queue="b")
        # Warm the claim's prepared statement: a cached plan still takes its locks before the
        # snapshot it executes with.
        assert await driver.claim(["c"], 1, lease=30, worker_id="w") == []
        # A pause under way (as pause_queue writes it): the lock, the row, not yet committed.
        await admin.execute("BEGIN")
        await admin.execute(f'LOCK TABLE "{pg_schema}".queue_pauses IN ACCESS EXCLUSIVE MODE')
        await admin.execute(
            f'INSERT INTO "{pg_schema}".queue_pauses (queue, paused_at) VALUES ($1, $2)',
            "a",
            driver.now(),
        )
        claimed: list[str] = []

        async def claim() -> None:
            claims = await driver.claim(["a", "b"], 5, lease=30, worker_id="w")
            claimed.extend(c.job_id for c in claims)

        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(claim)
                await eventually(lambda: _waits_for_the_pauses(admin, pg_schema))
                await admin.execute("COMMIT")
        assert claimed == [in_b]
        record = await driver.get(in_a)
        assert record is not None and record.state is JobState.READY
