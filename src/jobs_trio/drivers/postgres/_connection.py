# The PostgreSQL driver's connection layer: its pool and bridge, transactions, clock and close.
# Apart because every capability runs its statements through it and holds no state.
from __future__ import annotations

import contextlib
import weakref
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, TypeVar

import attrs
import trio

from ..._core.records import JobId, JobLimits
from .._limit_rules import LimitRow, decide, needs
from .._postgres_bridge import Bridge
from .._postgres_listener import Listener
from .._postgres_pool import Connection
from .._postgres_sql import Statements
from .._postgres_transaction import open_pooled_transaction
from .._rules import LAPSED_ERROR, driver_closed
from .._transaction import Transaction, unwrap

T = TypeVar("T")


# How often wait_for_work looks while the LISTEN connection is down (it cannot be woken then).
DEAF_POLL = 1.0


class PostgresConnection:
    """The PostgreSQL driver's connection layer: every capability's statements run through it."""

    def __init__(
        self,
        url: str,
        bridge: Bridge,
        statements: Statements,
        listener: Listener,
        clock: Callable[[], float],
    ) -> None:
        self.url = url
        self.bridge = bridge
        self.schema = statements.schema
        self._sql = statements
        self._listener = listener
        self._clock = clock
        self._closed = False
        self._outbox_source: str | None = None  # read once: a migration made it
        # Drivers found to be on this driver's database (shares_outbox): a database never moves.
        self._shares_with: weakref.WeakSet[PostgresConnection] = weakref.WeakSet()

    @property
    def loop(self) -> Any:
        """The trio-asyncio loop the driver's connections live on: an application's own
        connection passed as ``connection=`` must have been opened on it."""
        return self.bridge.loop

    @property
    def listening(self) -> bool:
        """Whether the driver LISTENs: from the first wait_for_work on, while its connection is
        up (before, nothing needs waking; while down, wait_for_work polls on its timeout)."""
        return self._listener.connected

    def now(self) -> float:
        return self._clock()

    def _check_open(self) -> None:
        if self._closed:
            raise driver_closed("PostgreSQL")

    # --- one named statement, alone on a pooled connection ---
    # Most reads and many small writes are only that; each capability asks it of these rather
    # than wrapping the statement in an operation of its own. Arguments that may raise (a
    # conversion of the caller's value) belong inside an operation, where the bridge names the
    # failure, not in these calls' arguments.

    async def _fetch(self, name: str, *args: Any, what: str) -> list[Any]:
        """The rows the statement ``name`` answers."""
        return list(await self._alone(name, args, "fetch", what))

    async def _fetchrow(self, name: str, *args: Any, what: str) -> Any:
        """The first row the statement ``name`` answers (None: none)."""
        return await self._alone(name, args, "fetchrow", what)

    async def _fetchval(self, name: str, *args: Any, what: str) -> Any:
        """The first column of the first row the statement ``name`` answers."""
        return await self._alone(name, args, "fetchval", what)

    async def _execute(self, name: str, *args: Any, what: str) -> None:
        await self._alone(name, args, "execute", what)

    async def _alone(self, name: str, args: Sequence[Any], method: str, what: str) -> Any:
        self._check_open()
        statement = self._sql[name]

        async def run(conn: Connection) -> Any:
            return await getattr(conn, method)(statement, *args)

        return await self.bridge.run(run, what=what)

    async def _run_here_or_on(
        self, connection: object | None, op: Callable[[Connection], Any], *, what: str
    ) -> Any:
        conn, tx = unwrap(connection)  # a jobs_trio.transaction(): its asyncpg connection
        if conn is None:
            return await self.bridge.run(op, what=what)
        if tx is None:
            return await self.bridge.run_on(conn, op, what=what)
        async with tx.lock:  # one statement at a time on the block's connection
            return await self.bridge.run_on(conn, op, what=what)

    # --- the application's transaction ---

    @contextlib.asynccontextmanager
    async def open_transaction(self) -> AsyncIterator[Transaction]:
        """A transaction on a connection of this driver's pool, for
        ``jobs_trio.transaction(driver)``: the application's SQL (``tx.execute``/``fetch``/
        ``fetchrow``/``fetchval``) and the jobs and events it enqueues commit together. Up to
        ``pool_size - 1`` blocks hold a connection at once (more wait for one): the driver's
        own operations always find the last."""
        self._check_open()
        async with open_pooled_transaction(self.bridge) as tx:
            yield tx

    async def _claim_limited(
        self, ids: Sequence[JobId], now: float, lease: float, worker_id: str
    ) -> dict[JobId, Any]:
        """Claim what the fleet limits allow of ``ids`` (claim order) and put the rest off, in
        one transaction: the jobs and their limit rows locked SKIP LOCKED (a claim never waits,
        so it never deadlocks with another, a renew or a settle), then the shared rule
        (_limit_rules.py) decides and one statement writes it all. Answers the granted rows."""
        sql = self._sql

        async def take(conn: Connection) -> dict[JobId, Any]:
            jobs = await conn.fetch(sql["claim_limited_jobs"], now, list(ids))
            candidates = [
                (
                    row["id"],
                    JobLimits(
                        row["slot_key"],
                        row["slots"] or 0,
                        row["rate_key"],
                        row["starts"] or 0,
                        row["per"] or 0.0,
                    ),
                )
                for row in jobs
            ]
            wanted = sorted({need for _, limits in candidates for need in needs(limits)})
            if not wanted:
                return {}
            kinds, keys, counts = ([w[i] for w in wanted] for i in range(3))
            await conn.execute(sql["limit_rows_create"], kinds, keys, counts)
            rows: dict[tuple[str, str], list[LimitRow]] = {}
            for row in await conn.fetch(sql["claim_limited_rows"], kinds, keys):
                rows.setdefault((row["kind"], row["key"]), []).append(LimitRow(*row))
            decision = decide(candidates, rows, now=now, lease=lease, missing_is_free=False)
            put_off = list(decision.put_off.items())
            # The taken rows' columns as unnest arrays: kind, key, n, until, token, job_id.
            rows_taken = map(attrs.astuple, decision.taken)
            taken = [list(column) for column in zip(*rows_taken, strict=True)]
            claimed = await conn.fetch(
                sql["claim_limited_take"],
                *(taken or [[]] * 6),
                now,
                [job_id for job_id, _ in put_off],
                [run_at for _, (run_at, _) in put_off],
                [waits for _, (_, waits) in put_off],
                LAPSED_ERROR,
                lease,
                worker_id,
                list(decision.granted),
                list(decision.granted.values()),
            )
            return {row["id"]: row for row in claimed}

        granted: dict[JobId, Any] = await self.bridge.run(
            take, what="claim (fleet limits)", transaction=True
        )
        return granted

    async def aclose(self) -> None:
        """Stop answering; the connections close when the ``async with`` that opened the
        driver ends (they belong to its scope, not to this call)."""
        self._closed = True
        self._listener.wake(None)
        await trio.lowlevel.checkpoint()

    async def _drop_schema(self) -> None:
        sql = self._sql

        async def drop(conn: Connection) -> None:
            await conn.execute(sql["drop_schema"])

        with trio.CancelScope(shield=True), trio.move_on_after(10):
            await self.bridge.run(drop, what=f"dropping schema {self.schema!r}", bounded=False)
