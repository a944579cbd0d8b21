# `jobs_trio.transaction(driver)` on PostgreSQL: an application's transaction on a connection of
# the driver's own pool, held for the block, its statements crossed the way the driver's own are.
# Apart from the driver because it is the application's transaction, not a driver operation:
# its cleanup rules (a commit that lands, a rollback that is bounded) are the application's.
from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

import trio

from .._core.logs import log_event
from ._postgres_bridge import Bridge
from ._postgres_pool import LIFT_IDLE_BOUND, Connection
from ._transaction import ROLLBACK_SECONDS, Transaction, owned


@contextlib.asynccontextmanager
async def open_pooled_transaction(bridge: Bridge) -> AsyncIterator[Transaction]:
    """A transaction on a connection held from ``bridge``'s pool for the block: begun, then
    committed when the block ends, rolled back when it raises or is cancelled."""
    async with bridge.held() as conn, owned(Transaction(conn, _PooledOps(bridge, conn))) as tx:
        yield tx


class _PooledOps:
    """Each statement one crossing on the held connection, under the driver's bounds: a Trio
    cancel cancels it on the server; no answer within the pool's statement timeout and margin
    drops the connection (postgres_bridge.Bridge.run_checked_out)."""

    def __init__(self, bridge: Bridge, conn: Connection) -> None:
        self._bridge = bridge
        self._conn = conn

    async def _run(self, sql: str, args: Sequence[Any] = ()) -> list[Any]:
        async def fetch(conn: Connection) -> list[Any]:
            return list(await conn.fetch(sql, *args))

        return await self._bridge.run_checked_out(self._conn, fetch, what="the application's SQL")

    async def in_transaction(self) -> bool:
        await trio.lowlevel.checkpoint()
        return bool(self._conn.is_in_transaction())

    async def begin(self) -> None:
        # The application's transaction may wait on its own work between statements (a call
        # to another service, a user): the pool's bound on a transaction left idle
        # (_postgres_pool.py) is for the driver's own, lifted here, in BEGIN's round trip.
        async def begin(conn: Connection) -> None:
            await conn.execute(f"BEGIN; {LIFT_IDLE_BOUND}")

        await self._bridge.run_checked_out(self._conn, begin, what="the application's BEGIN")

    async def commit(self) -> None:
        # Shielded: the block ended normally, so its writes are to land. A cancel arriving now
        # would leave the caller not knowing whether they had; it is heard once COMMIT answers.
        with trio.CancelScope(shield=True):
            await self._run("COMMIT")

    async def rollback(self) -> None:
        # Called shielded (owned); bounded here. A connection whose rollback failed or hung
        # still holds its transaction: the pool drops it when it comes back (Pool._give_back).
        with trio.move_on_after(ROLLBACK_SECONDS):
            try:
                await self._run("ROLLBACK")
                return
            except Exception as exc:
                log_event("jobs.transaction.rollback-failed", error=repr(exc))
        self._conn.terminate()

    async def execute(self, sql: str, args: Sequence[Any]) -> list[Any]:
        return await self._run(sql, args)
