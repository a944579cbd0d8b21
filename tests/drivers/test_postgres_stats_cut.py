# A read of the queues' figures cut by a cancel while its server has stopped answering: the
# driver gives up on its rollback within a second instead of waiting for the server for ever.
# Apart because it freezes a backend of a real server (SIGSTOP) under an in-process driver.
from __future__ import annotations

import os
import signal

import pytest
import trio

pytest.importorskip("asyncpg")

from jobs_trio.drivers._open_driver import open_driver
from tests.conftest import require_postgres

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

# Past this the test lets the frozen backend go on (SIGCONT): a rollback that waits for the
# server then ends, and the test reads how long it took instead of hanging with it.
THAW_AFTER = 8.0


@pytest.mark.parametrize("read", ["stats", "fleet_stats"])
async def test_a_stats_read_cut_on_a_frozen_server_returns_within_a_second(read: str) -> None:
    # The worker's look at its queues ran in a transaction of asyncpg's own, whose rollback
    # after a cancel waited for the server unbounded: a worker SIGTERMed as its server stopped
    # answering logged jobs.lifecycle.closed and then never ended (10 minutes, grace 3 s).
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

        async def look() -> None:
            with cut:
                if read == "stats":
                    await driver.stats()
                else:
                    await driver.fleet_stats("w-1", 15.0)
            returned.append(trio.current_time())

        async with trio.open_nursery() as nursery:
            nursery.start_soon(look)

            async def read_waits() -> int | None:
                pid: int | None = await watcher.fetchval_now(
                    "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                    " AND wait_event_type = 'Lock' AND application_name LIKE 'jobs_trio:%'"
                )
                return pid

            with trio.fail_after(20):
                while (pid := await read_waits()) is None:
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
    took = returned[0] - cut_at
    print(f"\n{read} returned {took:.2f} s after its cut")
    assert took < 2.5, f"{took:.2f} s: the cut read waited for the frozen server"
