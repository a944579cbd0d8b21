# The crossing from Trio into asyncpg: the trio-asyncio loop (borrowed or owned), the pool, and
# running each driver operation as ONE asyncio coroutine crossed once. Apart because every rule
# of that crossing (cancel, bounded cleanup, lost connections → DriverError) lives here alone.
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar, cast
from urllib.parse import urlparse

import trio

from ..errors import ConfigError, DriverError, JobsError

T = TypeVar("T")

# asyncpg is untyped; a connection is whatever it hands us.
Connection = Any
Operation = Callable[[Connection], Awaitable[T]]

# How long a rollback, a release or a close may take once the operation around it is over or
# cancelled. Past it the connection is terminated: a cleanup that hangs would turn one lost
# connection into a worker that cannot stop.
CLEANUP_SECONDS = 5.0
CONNECT_SECONDS = 10.0


class Bridge:
    """The asyncio side of the PostgreSQL driver, seen from Trio.

    Every public method is Trio-flavoured and crosses into asyncio once. Nothing here hands an
    asyncio context manager to a caller: a Trio cancel landing inside one crossed piecemeal
    leaves a transaction open or a pool connection leaked (STACK-NOTES), so transactions and
    pool checkouts begin and end inside the one coroutine."""

    def __init__(self, url: str, loop: Any, pool: Any, application_name: str) -> None:
        self.url = url
        self.loop = loop
        self.application_name = application_name
        self._pool = pool
        parsed = urlparse(url)
        self._where = f"{parsed.hostname or 'localhost'}:{parsed.port or 5432}"

    async def run(self, op: Operation[T], *, what: str, transaction: bool = False) -> T:
        """Run ``op`` on a pooled connection (inside a transaction when asked), crossing once."""
        return await self._cross(self._in_pool, op, transaction, what=what)

    async def run_on(self, connection: Connection, op: Operation[T], *, what: str) -> T:
        """Run ``op`` on the caller's own connection, inside a savepoint when the caller has a
        transaction open (so it commits or rolls back with theirs), else a transaction."""
        import asyncpg

        if not isinstance(connection, asyncpg.Connection | asyncpg.pool.PoolConnectionProxy):
            raise DriverError(
                f"connection= must be an asyncpg connection, not {type(connection).__name__}",
                fix="pass the asyncpg connection your transaction runs on, opened on the same "
                "trio-asyncio loop as the driver",
            )
        return await self._cross(self._on_connection, connection, op, what=what)

    async def connect(self) -> Connection:
        """A connection of its own, outside the pool (the LISTEN connection)."""
        import asyncpg

        async def connect() -> Connection:
            return await asyncpg.connect(
                self.url,
                timeout=CONNECT_SECONDS,
                server_settings={"application_name": self.application_name + ":listen"},
            )

        return await self._cross(connect, what="open the LISTEN connection")

    async def call(self, fn: Callable[[], Awaitable[T]], *, what: str) -> T:
        """Cross with any asyncio coroutine function (a LISTEN registration, a ping)."""
        return await self._cross(fn, what=what)

    async def close_connection(self, connection: Connection) -> None:
        """Close a connection of our own; shielded and bounded, so it runs even under a
        cancelled scope and never hangs a teardown."""
        with trio.CancelScope(shield=True):
            with trio.move_on_after(CLEANUP_SECONDS):
                with contextlib.suppress(Exception):
                    await self._cross(connection.close, what="close a connection")
                    return
            connection.terminate()

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True):
            with trio.move_on_after(CLEANUP_SECONDS):
                with contextlib.suppress(Exception):
                    await self._cross(self._pool.close, what="close the pool")
                    return
            # Connections still checked out (an operation that never finished) or a server
            # that stopped answering: drop them rather than wait on them.
            self._pool.terminate()

    async def _cross(self, fn: Callable[..., Awaitable[T]], *args: Any, what: str) -> T:
        import trio_asyncio

        try:
            return cast(T, await trio_asyncio.aio_as_trio(fn, loop=self.loop)(*args))
        except JobsError:
            raise
        except Exception as exc:
            translated = self._translate(exc, what)
            if translated is None:
                raise
            raise translated from exc

    def _translate(self, exc: Exception, what: str) -> DriverError | None:
        import asyncpg

        if isinstance(exc, asyncpg.exceptions.QueryCanceledError):
            return DriverError(
                f"PostgreSQL cancelled {what} at {self._where}: {exc}",
                fix="check statement_timeout and whether an operator ran pg_cancel_backend; "
                "the operation can be retried",
            )
        lost = (
            asyncpg.PostgresConnectionError,
            asyncpg.InterfaceError,
            asyncpg.exceptions.OperatorInterventionError,
            asyncpg.exceptions.CannotConnectNowError,
        )
        if isinstance(exc, lost):
            return DriverError(
                f"lost the connection to PostgreSQL at {self._where} during {what}: {exc}",
                fix="retry the operation: the pool replaces dead connections on its own; if it "
                "keeps failing, check that the server is up and reachable",
            )
        if isinstance(exc, OSError):  # refused, unreachable, timed out (TimeoutError included)
            return DriverError(
                f"cannot reach PostgreSQL at {self._where} during {what}: "
                f"{type(exc).__name__}: {exc}",
                fix="check that the server is running and the URL's host and port are right; "
                "the operation can be retried once it answers",
            )
        if isinstance(exc, asyncpg.PostgresError):
            return DriverError(
                f"PostgreSQL refused {what}: [{exc.sqlstate}] {exc}",
                fix="retry the operation; if it fails the same way, the database may have been "
                "changed by hand: run `jobs-trio migrate` and check the server's log",
            )
        return None

    # --- the asyncio side: each runs inside ONE crossing ---

    async def _in_pool(self, op: Operation[T], transaction: bool) -> T:
        conn = await self._pool.acquire()
        try:
            if not transaction:
                return await op(conn)
            return await _in_transaction(conn, op)
        finally:
            await self._release(conn)

    async def _on_connection(self, conn: Connection, op: Operation[T]) -> T:
        return await _in_transaction(conn, op)

    async def _release(self, conn: Connection) -> None:
        try:
            # The pool waits out a cancelled query and rolls back a leftover transaction
            # before handing the connection on; it terminates one it cannot reset.
            await asyncio.wait_for(self._pool.release(conn), CLEANUP_SECONDS)
        except (Exception, asyncio.CancelledError):
            conn.terminate()


async def _in_transaction(conn: Connection, op: Operation[T]) -> T:
    tx = conn.transaction()  # a savepoint when the connection is already in a transaction
    await tx.start()
    try:
        result = await op(conn)
    except BaseException:
        # A cancel thrown into `op` has already asked the server to cancel its statement; the
        # rollback waits for that, bounded. Trio-asyncio cancels a crossing once, so this
        # await is not cancelled again.
        try:
            await asyncio.wait_for(tx.rollback(), CLEANUP_SECONDS)
        except (Exception, asyncio.CancelledError):
            conn.terminate()
        raise
    await tx.commit()
    return result


async def _keep_session(conn: Connection) -> None:
    """The pool's reset: nothing beyond the rollback asyncpg always does. The driver sets no
    session state, and the default reset (UNLISTEN, RESET ALL, …) is a round trip per op."""


@contextlib.asynccontextmanager
async def open_bridge(
    url: str, *, loop: Any = None, pool_size: int, application_name: str
) -> AsyncIterator[Bridge]:
    """A bridge on ``loop``, else on the trio-asyncio loop the caller already runs in, else on
    a loop of its own for as long as the bridge is open."""
    # Imported here, never at module level: importing trio_asyncio changes asyncio for the
    # whole process (STACK-NOTES), and only applications that use PostgreSQL should pay that.
    import trio_asyncio

    if not isinstance(pool_size, int) or pool_size < 1:
        raise ConfigError(
            f"pool_size must be a positive whole number, not {pool_size!r}",
            fix="pass pool_size=10 (or the number of operations you run at once)",
        )
    if loop is None:
        loop = trio_asyncio.current_loop.get()
    if loop is not None:
        async with _open_pool(url, loop, pool_size, application_name) as bridge:
            yield bridge
        return
    async with (
        trio_asyncio.open_loop() as own_loop,
        _open_pool(url, own_loop, pool_size, application_name) as bridge,
    ):
        yield bridge


@contextlib.asynccontextmanager
async def _open_pool(
    url: str, loop: Any, pool_size: int, application_name: str
) -> AsyncIterator[Bridge]:
    import asyncpg

    async def create() -> Any:
        return await asyncpg.create_pool(
            url,
            min_size=1,
            max_size=pool_size,
            timeout=CONNECT_SECONDS,
            reset=_keep_session,
            server_settings={"application_name": application_name},
        )

    opener = Bridge(url, loop, None, application_name)
    pool = await opener._cross(create, what="open the connection pool")
    bridge = Bridge(url, loop, pool, application_name)
    try:
        yield bridge
    finally:
        await bridge.aclose()
