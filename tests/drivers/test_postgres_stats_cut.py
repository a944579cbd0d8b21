# An operation cut by a cancel while its server has stopped answering (its backend SIGSTOPped):
# the driver gives up on the cleanup in bounded time instead of waiting for the server for ever.
# Apart because it freezes a backend of a real server under an in-process driver.
from __future__ import annotations

import os
import signal
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio

pytest.importorskip("asyncpg")

from jobs_trio.drivers._asyncio_stepper import CANCEL_THROUGH_SECONDS
from jobs_trio.drivers._open_driver import open_driver
from tests.conftest import require_postgres
from tests.helpers.process_helpers import LOADED

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

# Past this the test lets the frozen backend go on (SIGCONT): a cleanup that waits for the
# server then ends, and the test reads how long it took instead of hanging with it.
THAW_AFTER = CANCEL_THROUGH_SECONDS + 4.0


async def seconds_to_return_after_a_cut(call: Callable[[Any], Awaitable[object]]) -> float:
    """``call(driver)`` on a fresh database, its statement waiting on a lock when its backend
    is frozen and the call cancelled: how long the call then takes to return."""
    from tests.drivers.test_postgres_driver import open_admin
    from tests.drivers.test_processes_postgres import fresh_database

    async with (
        fresh_database(require_postgres()) as url,
        open_admin(url) as locker,
        open_admin(url) as watcher,
        open_driver(f"{url}?lock_timeout=0") as driver,
    ):
        await driver.stats()  # the pool's connection, open and idle
        await locker.execute("BEGIN")
        await locker.execute("LOCK TABLE jobs_trio.jobs IN ACCESS EXCLUSIVE MODE")
        cut = trio.CancelScope()
        returned: list[float] = []

        async def run() -> None:
            with cut:
                await call(driver)
            returned.append(trio.current_time())

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run)

            async def waiting_pid() -> int | None:
                pid: int | None = await watcher.fetchval_now(
                    "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                    " AND wait_event_type = 'Lock' AND application_name LIKE 'jobs_trio:%'"
                )
                return pid

            with trio.fail_after(20):
                while (pid := await waiting_pid()) is None:
                    await trio.sleep(0.02)
            os.kill(pid, signal.SIGSTOP)
            try:
                cut_at = trio.current_time()
                cut.cancel()
                with trio.move_on_after(THAW_AFTER):
                    while not returned:
                        await trio.sleep(0.02)
            finally:
                os.kill(pid, signal.SIGCONT)
            await locker.execute("ROLLBACK")
    return returned[0] - cut_at


@pytest.mark.parametrize("read", ["stats", "fleet_stats"])
async def test_a_stats_read_cut_on_a_frozen_server_returns_within_a_second(read: str) -> None:
    # The worker's look at its queues ran in a transaction of asyncpg's own, whose rollback
    # after a cancel waited for the server unbounded: a worker SIGTERMed as its server stopped
    # answering logged jobs.lifecycle.closed and then never ended (10 minutes, grace 3 s). It
    # is the driver's transaction now, whose rollback after a cancel waits 1 s.
    async def look(driver: Any) -> object:
        if read == "stats":
            return await driver.stats()
        return await driver.fleet_stats("w-1", 15.0)

    took = await seconds_to_return_after_a_cut(look)
    print(f"\n{read} returned {took:.2f} s after its cut")
    # 1.00 s alone; the frozen server's thaw (8 s) without the bound.
    assert took < 1.0 + LOADED, f"{took:.2f} s: the cut read waited for the frozen server"


async def test_any_cleanup_of_a_cut_operation_is_bounded_on_a_frozen_server(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # An operation that opens asyncpg's own transaction (as the stats read did): its rollback
    # after the cut is the coroutine's own, shielded from later cancels, and nothing in the
    # driver bounded it. The stepper drops the connection CANCEL_THROUGH_SECONDS after the cut,
    # and says so (the bridge then drops its other connections at once, as after any cancel
    # the server did not serve).
    async def own_transaction(conn: Any) -> object:
        async with conn.transaction():
            return await conn.fetchval("SELECT count(*) FROM jobs_trio.jobs")

    async def call(driver: Any) -> object:
        return await driver.bridge.run(own_transaction, what="a test's read")

    took = await seconds_to_return_after_a_cut(call)
    print(f"\nown transaction returned {took:.2f} s after its cut")
    # 5.00 s alone; the thaw (9 s) without the bound.
    assert took < CANCEL_THROUGH_SECONDS + LOADED, f"{took:.2f} s: waited for the frozen server"
    events = [getattr(record, "event", None) for record in caplog.records]
    assert "jobs.driver.cleanup-dropped" in events, events
