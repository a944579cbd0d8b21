# The crossing from Trio into asyncpg: the trio-asyncio loop (borrowed or owned), and running
# each driver operation as ONE asyncio coroutine crossed once. Apart because every rule of that
# crossing (cancel, bounded cleanup, lost connections → DriverError) lives here alone.
from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping
from typing import Any, TypeVar, cast
from urllib.parse import urlparse

import trio

from .._core.errors import ConfigError, DriverError, JobsError, RowLocked, ValueRefused
from .._core.forked_child import end_if_forked, own_pid
from .._core.logs import log_event
from .._core.redaction import redact_url
from ._asyncio_stepper import CANCEL_THROUGH_SECONDS, step_to_end
from ._direct_reads import let_loop_read, take_over, transport_of
from ._postgres_errors import (
    LOCK_TIMEOUT_STATE,
    sqlstate_of,
    translate,
)
from ._postgres_locks import LockHolder, described
from ._postgres_pool import Connection, Pool
from ._postgres_pooler import Pooler

T = TypeVar("T")

Operation = Callable[[Connection], Awaitable[T]]
# Who held the locks a statement waited for past ``waited`` seconds (_postgres_locks): given by
# the opener, which knows the schema and its statement.
NameHolders = Callable[[Connection, float], Awaitable[list[LockHolder]]]

# How long a rollback, a release or a close may take once the operation around it is over or
# cancelled. Past it the connection is terminated: a cleanup that hangs would turn one lost
# connection into a worker that cannot stop.
CLEANUP_SECONDS = 5.0
CONNECT_SECONDS = 10.0
# How long closing a connection may wait for the server's end of it before it is dropped: a
# healthy server answers within milliseconds, and the driver closes after the worker's drain,
# past its grace period. At CLEANUP_SECONDS, a stalled server made an idle worker's exit take
# 10 s after a 1 s grace (the LISTEN connection's close, then the pool's).
CLOSE_SECONDS = 1.0
# How long past its statement_timeout an operation on a pooled connection may go unanswered
# before the connection is given up on. The server bounds what it hears; a connection whose
# packets go nowhere (a failover that moved the address, a frozen proxy) is never heard, and
# its operation waited for the kernel to give up on TCP: ~15 minutes of a worker that ran
# nothing and said nothing (a review's blackholing proxy). The margin covers an operation of
# several statements and its cleanup (a rollback waits up to CLEANUP_SECONDS).
ANSWER_MARGIN_SECONDS = 10.0

# How long naming the holders of a lock may take before the lock error goes out without them.
NAME_HOLDERS_SECONDS = 2.0


class Bridge:
    """The asyncio side of the PostgreSQL driver, seen from Trio.

    Every public method is Trio-flavoured and crosses into asyncio once (plus one to open a
    connection when the pool has none idle). Nothing here hands an asyncio context manager to
    a caller: a Trio cancel landing inside one crossed piecemeal leaves a transaction open and
    aborted (STACK-NOTES), so a transaction begins and ends inside the one coroutine."""

    def __init__(
        self,
        url: str,
        loop: Any,
        pool_size: int,
        application_name: str,
        session: Mapping[str, str],
        pooler: Pooler | None = None,
        name_holders: NameHolders | None = None,
    ) -> None:
        self.url = url
        # Direct, or through PgBouncer: what a connection opens with, and where LISTEN goes.
        self.pooler = pooler or Pooler.of(url)
        self.loop = loop
        self.application_name = application_name
        # The server settings of our own pooled connections (postgres_pool.session_settings),
        # never of an application's connection nor of the LISTEN one, which waits on purpose.
        self.session = dict(session)
        self._answer_within = _answer_bound(self.session)
        self._lock_wait = _seconds(self.session.get("lock_timeout", "0"))
        self._name_holders = name_holders
        self._pool = Pool(self._open_pooled, pool_size, retire=self._retire)
        self._holds = trio.Semaphore(max(1, pool_size - 1))
        self._where = _where(url)
        self._owner = own_pid()
        # The server left a cancel unanswered and has answered nothing since (_retire).
        self._unanswered = False

    async def run(
        self,
        op: Operation[T],
        *,
        what: str,
        transaction: bool = False,
        bounded: bool = True,
        lock_wait: float | None = None,
    ) -> T:
        """Run ``op`` on a pooled connection (inside a transaction when asked), crossing once.
        Unanswered past its statement_timeout and a margin, the connection is dropped and the
        operation fails retryably (``bounded=False`` for a migration, which lifts the timeout).
        A lock it waited for past its lock timeout (``lock_wait`` seconds when ``op`` sets its
        own, else the session's) fails it with the sessions that held it named."""
        async with self._pool.checkout() as conn:
            return await self.run_checked_out(
                conn, op, what=what, transaction=transaction, bounded=bounded, lock_wait=lock_wait
            )

    async def run_checked_out(
        self,
        conn: Connection,
        op: Operation[T],
        *,
        what: str,
        transaction: bool = False,
        bounded: bool = True,
        lock_wait: float | None = None,
    ) -> T:
        """``run`` on a pooled connection the caller holds already (``held``)."""
        with trio.move_on_after(self._answer_within if bounded else math.inf):
            try:
                return await self._cross(
                    self._on_pooled, conn, op, transaction, what=what, reads=transport_of(conn)
                )
            except RowLocked as locked:
                # The server answered and rolled back: the connection is sound, and can say
                # who held the lock (only a lock timeout: a deadlock's victim waited for nobody
                # in particular, and a settle's skipped rows are its own answer).
                if sqlstate_of(locked.__cause__) != LOCK_TIMEOUT_STATE:
                    raise
                waited = self._lock_wait if lock_wait is None else lock_wait
                raise await self._named(conn, locked, waited, trio.current_time()) from (
                    locked.__cause__
                )
            except ValueRefused:
                raise  # the server answered and rolled back: the connection is sound
            except DriverError:
                # The database failed this operation in a way we did not plan for (a lost
                # connection, an error mid-protocol): whatever state that left the
                # connection in, the next operation gets a fresh one instead. Domain errors
                # (JobNotFound, InvalidTransition) are not DriverErrors and keep it.
                conn.terminate()
                raise
        # Nothing came back: whether the statement reached the server is unknown, and the
        # connection may still owe the end of a cancelled one, which would hang the next
        # operation on it. Dropped; the caller retries on a fresh one.
        conn.terminate()
        raise DriverError(
            f"no answer from PostgreSQL at {self._where} within {self._answer_within:g} s"
            f" during {what}",
            fix="the server, or something between (a proxy, a failover that moved the"
            " address), stopped answering this connection; the operation can be retried on"
            " a new one, which the pool opens",
        )

    @contextlib.asynccontextmanager
    async def held(self) -> AsyncIterator[Connection]:
        """A pooled connection for the caller to hold across several operations (an
        application's transaction, ``jobs_trio.transaction(driver)``), each run with
        ``run_checked_out``. At most one fewer than the pool's size are held at once: the
        driver's own operations (a worker's renewals and settles) always find a connection.
        Handed back still inside a transaction (a rollback that failed), it is dropped."""
        async with self._holds, self._pool.checkout() as conn:
            yield conn

    async def run_on(self, connection: Connection, op: Operation[T], *, what: str) -> T:
        """Run ``op`` on the caller's own connection, inside a savepoint when the caller has a
        transaction open (so it commits or rolls back with theirs), else a transaction."""
        import asyncpg

        if not isinstance(connection, asyncpg.Connection | asyncpg.pool.PoolConnectionProxy):
            raise ConfigError(
                f"connection= must be an asyncpg connection, not {type(connection).__name__}",
                fix="pass the asyncpg connection your transaction runs on, opened on the same "
                "trio-asyncio loop as the driver",
            )
        if getattr(connection, "_loop", self.loop) is not self.loop:
            # Its replies are read on another loop: stepped here, they would never arrive (or
            # arrive on the wrong loop). Two drivers that each opened a loop of their own.
            raise ConfigError(
                "the connection belongs to another trio-asyncio loop than this driver's",
                fix="open the connection on the driver's loop (driver.loop), or open both"
                " drivers inside one trio_asyncio.open_loop() block so they share it",
            )
        # A connection of our pool held by the caller (Bridge.held) is read by this task, not
        # by the loop (direct_reads); an application's own connection is read by the loop.
        return await self._cross(
            self._on_connection, connection, op, what=what, reads=transport_of(connection)
        )

    async def connect(self, *, purpose: str, connection_class: type | None = None) -> Connection:
        """A new connection, named ``<application_name>:<purpose>`` on the server (an instance
        of ``connection_class``, a subclass of asyncpg's, when given)."""
        connect = self.connector(purpose=purpose, connection_class=connection_class)
        return await self._cross(connect, what=f"connecting ({purpose})", as_task=True)

    def connector(
        self, *, purpose: str, connection_class: type | None = None
    ) -> Callable[[], Awaitable[Connection]]:
        """The asyncio coroutine function that opens ``connect``'s connection, on whatever
        asyncio loop runs it (the lease lifeline runs it on a plain loop of its own)."""
        import asyncpg

        pooler = self.pooler
        # LISTEN, and a session that must keep its state (`index`: a migration's index build),
        # go where a session is kept; None there (PgBouncer pooling transactions, no direct
        # address) is checked by their callers.
        target = {"listen": pooler.listen_url, "index": pooler.session_url}.get(purpose, pooler.url)
        options = pooler.connect_options(purpose, self.session)
        options["server_settings"] = {
            "application_name": f"{self.application_name}:{purpose}",
            **options["server_settings"],
        }
        if connection_class is not None:
            options["connection_class"] = connection_class
        sets = pooler.session_sets(purpose, self.session)

        async def connect() -> Connection:
            conn = await asyncpg.connect(target, timeout=CONNECT_SECONDS, **options)
            if sets is not None:
                try:
                    await conn.execute(sets)  # one round trip, in the same crossing
                except BaseException:
                    conn.terminate()
                    raise
            return conn

        return connect

    async def _open_pooled(self) -> Connection:
        conn = await self.connect(purpose="pool")
        take_over(conn)  # each operation on it reads its replies itself (direct_reads)
        return conn

    async def _retire(self, conn: Connection) -> None:
        """A connection whose operation a cancel cut short, before the pool closes it: asyncpg
        has sent the server a CancelRequest for its query (a task on the loop); closed at
        once, that task is cancelled with it and the query runs on (a pg_sleep(30) kept its
        backend busy for 30 s). Waited for within CLOSE_SECONDS. Run shielded by the pool."""
        pending = [t for t in getattr(conn, "_cancellations", ()) if not t.done()]
        if not pending or self._unanswered:
            return
        # The task also waits for the cancelled statement's end, which only a read of the
        # socket brings: the loop reads it again for that (nobody else will, direct_reads).
        let_loop_read(conn)

        async def cancelled_on_the_server() -> None:
            await asyncio.wait(pending)

        with trio.move_on_after(CLOSE_SECONDS) as waited, contextlib.suppress(Exception):
            await self._cross(cancelled_on_the_server, what="cancelling a query", as_task=True)
        if waited.cancelled_caught:
            # Not even a cancel was served: every close from here drops its connection at once
            # (a goodbye and two closes at CLOSE_SECONDS each made a stalled worker's exit 5 s).
            self._unanswered = True

    async def call(self, fn: Callable[[], Awaitable[T]], *, what: str) -> T:
        """Cross with any asyncio coroutine function (a LISTEN registration, a ping)."""
        return await self._cross(fn, what=what, as_task=True)

    async def close_connection(self, connection: Connection) -> None:
        """Close a connection of our own; shielded and bounded, so it runs even under a
        cancelled scope and never hangs a teardown."""
        if self._unanswered:
            connection.terminate()
            return
        with trio.CancelScope(shield=True):
            with trio.move_on_after(CLOSE_SECONDS):
                with contextlib.suppress(Exception):
                    await self._cross(connection.close, what="close a connection", as_task=True)
                    return
            connection.terminate()

    async def aclose(self) -> None:
        idle, held = self._pool.take_all()
        for conn in idle:
            let_loop_read(conn)  # asyncpg's close waits for the server's end, read by the loop
        # Not one an operation still holds: its task may be waiting for the socket, and the
        # loop's reader would fail on the same descriptor ("another task is already reading").
        # Its close fails the operation, and the pool terminates it as the operation ends.
        connections = idle + held
        if self._unanswered:
            for conn in connections:
                conn.terminate()
            return

        async def close_all() -> None:
            await asyncio.gather(*(c.close() for c in connections), return_exceptions=True)

        with trio.CancelScope(shield=True):
            with trio.move_on_after(CLOSE_SECONDS):
                with contextlib.suppress(Exception):
                    await self._cross(close_all, what="closing connections", as_task=True)
            # Whatever did not close in time (an operation that never finished, a server that
            # stopped answering) is dropped rather than waited on.
            for conn in connections:
                if not conn.is_closed():
                    conn.terminate()

    async def _cross(
        self,
        fn: Callable[..., Awaitable[T]],
        *args: Any,
        what: str,
        as_task: bool = False,
        reads: asyncio.Transport | None = None,
    ) -> T:
        import trio_asyncio

        # A child forked by a job body shares these sockets: it must never speak on them.
        end_if_forked(self._owner)
        try:
            if as_task:
                # Wrapped in an asyncio Task: asyncpg.connect (asyncio.timeout) and a close need
                # a current task. They are rare; every operation steps from this Trio task.
                result = cast(T, await trio_asyncio.aio_as_trio(fn, loop=self.loop)(*args))
            else:
                coro = cast(Coroutine[Any, Any, T], fn(*args))
                result = await step_to_end(
                    self.loop, coro, reads=reads, on_drop=self._cleanup_dropped
                )
            self._unanswered = False
            return result
        except JobsError:
            raise
        except Exception as exc:
            raise translate(exc, what, url=self.url, where=self._where) from exc

    def translate(self, exc: Exception, what: str) -> JobsError:
        """What a caller sees for ``exc``, raised by asyncpg during ``what`` (``_cross``'s
        rules, for an operation crossed some other way: the lease lifeline's)."""
        return translate(exc, what, url=self.url, where=self._where)

    @property
    def answer_within(self) -> float:
        """How long an operation on a pooled connection may go unanswered (see ``run``)."""
        return self._answer_within

    # --- the asyncio side: each runs inside ONE crossing ---

    async def _on_pooled(self, conn: Connection, op: Operation[T], transaction: bool) -> T:
        if transaction:
            return await _in_transaction(conn, op, unanswered=self._cancel_unanswered)
        return await op(conn)

    async def _named(
        self, conn: Connection, locked: RowLocked, waited: float, failed_at: float
    ) -> RowLocked:
        """``locked`` with the sessions that held the lock named, when they can be found in
        NAME_HOLDERS_SECONDS; as it was otherwise (the error is the news, not its lookup)."""
        name_holders = self._name_holders
        if name_holders is None:
            return locked

        async def look(conn: Connection) -> list[LockHolder]:
            # Open since before the wait began: ``waited`` before the error, and the error
            # came back a moment ago. A statement that began just after (a worker's, queued
            # behind the same lock) is not what held it.
            return await name_holders(conn, waited + trio.current_time() - failed_at)

        holders: list[LockHolder] | None = None
        with trio.move_on_after(NAME_HOLDERS_SECONDS), contextlib.suppress(Exception):
            holders = await self._cross(
                self._on_pooled,
                conn,
                look,
                False,
                what="naming lock holders",
                reads=transport_of(conn),
            )
        if holders is None:
            return locked
        return RowLocked(
            f"{locked.cause}; {described(holders)}",
            fix=locked.fix,
            holders=tuple(holders),
        )

    def _cancel_unanswered(self) -> None:
        self._unanswered = True

    def _cleanup_dropped(self) -> None:
        """The stepper dropped a connection whose cleanup after a cancel went unanswered: the
        server is not answering, so the closes from here drop theirs at once too."""
        self._unanswered = True
        log_event(
            "jobs.driver.cleanup-dropped",
            logging.WARNING,
            seconds=CANCEL_THROUGH_SECONDS,
            why=f"PostgreSQL at {self._where} answered nothing of a cancelled operation's"
            " cleanup (its rollback, its statement's end); the connection was dropped and the"
            " server rolls back what it left open",
        )

    async def _on_connection(self, conn: Connection, op: Operation[T]) -> T:
        if not conn.is_in_transaction():
            return await _in_transaction(conn, op)
        # Inside the caller's transaction (begun with BEGIN or asyncpg's transaction(); asyncpg
        # refuses its own savepoint API under a manual BEGIN, so plain SQL): a savepoint, so a
        # failure here rolls back only our writes and leaves the caller's transaction usable.
        await conn.execute("SAVEPOINT jobs_trio_write")
        try:
            result = await op(conn)
        except BaseException:
            try:
                await asyncio.wait_for(
                    conn.execute("ROLLBACK TO SAVEPOINT jobs_trio_write"), CLEANUP_SECONDS
                )
            except (Exception, asyncio.CancelledError):
                conn.terminate()
            raise
        await conn.execute("RELEASE SAVEPOINT jobs_trio_write")
        return result


async def _in_transaction(
    conn: Connection, op: Operation[T], *, unanswered: Callable[[], None] | None = None
) -> T:
    """``op`` inside a transaction of its own on ``conn``. ``unanswered`` (given for the pool's
    connections only) is told when a cancel thrown into ``op`` was not served within
    CLOSE_SECONDS (the server stopped answering)."""
    tx = conn.transaction()
    try:
        await tx.start()
    except BaseException:
        # BEGIN failed or was cancelled in flight: asyncpg keeps the failed transaction as the
        # connection's top one (its next transaction() would only be a SAVEPOINT, released but
        # never committed), and the server may have begun it while the connection still reads
        # as idle (the pool would hand it on). Such a connection is never used again.
        conn.terminate()
        raise
    try:
        result = await op(conn)
    except BaseException as exc:
        # A cancel thrown into `op` has already asked the server to cancel its statement; the
        # rollback waits for that, bounded. A crossing is cancelled once (asyncio_stepper), so
        # this await is not cancelled again. A pooled connection cut by a cancel waits only as
        # long as a retire waits for one (Bridge._retire): a drain cut a prune batch on a server
        # that had stopped answering, and the idle worker's exit waited CLEANUP_SECONDS for this
        # rollback, past its grace (CI: 5.06 s after SIGTERM, grace 3 s); the pool drops such a
        # connection anyway, and the server rolls its transaction back. The application's own
        # connection keeps CLEANUP_SECONDS: dropped, it is the application's loss, and a slow
        # link (0.5 s a round trip) needs more than 1 s for the cancel and the rollback.
        cut = unanswered is not None and isinstance(exc, asyncio.CancelledError)
        try:
            await asyncio.wait_for(tx.rollback(), CLOSE_SECONDS if cut else CLEANUP_SECONDS)
        except TimeoutError:
            conn.terminate()
            if cut and unanswered is not None:
                unanswered()
        except (Exception, asyncio.CancelledError):
            conn.terminate()
        raise
    await tx.commit()
    return result


def _seconds(setting: str) -> float:
    """A session setting as session_settings writes it (``"2000ms"``), in seconds."""
    return float(setting.removesuffix("ms") or 0) / 1000


def _answer_bound(session: Mapping[str, str]) -> float:
    """Seconds an operation may go unanswered: the session's statement_timeout (whole
    milliseconds, as session_settings writes it) plus the margin; unbounded when it is off."""
    seconds = _seconds(session.get("statement_timeout", "0"))
    if seconds <= 0:
        return math.inf
    return seconds + ANSWER_MARGIN_SECONDS


def _where(url: str) -> str:
    """``host:port`` for messages (never the whole URL: it may hold a password), once the
    URL's port is known to be one; urllib raises a bare ValueError for ``:99999``."""
    parsed = urlparse(url)
    try:
        port = parsed.port
    except ValueError as exc:
        raise ConfigError(
            f"the PostgreSQL URL {redact_url(url)!r} has a bad port: {exc}",
            fix="write the port as a number from 1 to 65535 (PostgreSQL listens on 5432"
            " unless told otherwise), e.g. postgresql://user@host:5432/db",
        ) from exc
    return f"{parsed.hostname or 'localhost'}:{port or 5432}"
