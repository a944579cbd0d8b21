# The application's current transaction: `async with jobs_trio.transaction(target)` opens one and
# every enqueue inside it, however deep in the call stack, joins it without `connection=`.
# Apart because it is the one place that begins, commits and rolls back an APPLICATION's
# transaction (asyncpg or sqlite3), and knows what may only run once that commit has happened.
from __future__ import annotations

import contextlib
import contextvars
import sqlite3
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any, Protocol

import trio

from .._core.errors import ConfigError, StepError
from .._core.logs import log_event

# How long a rollback may take once the block has failed or been cancelled; past it an asyncpg
# connection is terminated rather than left inside an aborted transaction.
ROLLBACK_SECONDS = 5.0

_current: contextvars.ContextVar[Transaction | None] = contextvars.ContextVar(
    "jobs_trio_transaction", default=None
)


class _Ops(Protocol):
    """What the transaction needs from one kind of connection."""

    async def in_transaction(self) -> bool: ...

    async def begin(self) -> None: ...

    async def commit(self) -> None: ...

    async def rollback(self) -> None: ...

    async def execute(self, sql: str, args: Sequence[Any]) -> list[Any]: ...


class Transaction:
    """An open transaction. ``connection`` is its connection; drivers enlist their writes in
    it. ``execute`` / ``fetch`` / ``fetchrow`` / ``fetchval`` run the application's own SQL in
    it (placeholders as the database writes them: ``$1`` on PostgreSQL, ``?`` on SQLite)."""

    def __init__(self, connection: object, ops: _Ops) -> None:
        self.connection = connection
        self._ops = ops
        self._after_commit: list[Callable[[], None]] = []
        self.owned = False  # whether this block began it (and so commits or rolls it back)
        # The step.transaction whose function runs in it now (steps.py), else None: a block
        # opened inside that function would commit apart from the step's record.
        self.step: str | None = None
        # One statement at a time on the connection, however many tasks of the block run SQL
        # or enqueue in it: a connection is one conversation (asyncpg refuses a second
        # operation in progress, and two readers of one socket would steal each other's reply).
        self.lock = trio.StrictFIFOLock()

    def after_commit(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` once the transaction has committed (never after a rollback): a wake-up
        sent before the commit would find nothing to claim, and the worker would sleep on."""
        self._after_commit.append(fn)

    async def execute(self, sql: str, *args: Any) -> list[Any]:
        """Run ``sql`` with ``args`` in this transaction; answer the rows it returned."""
        async with self.lock:
            return await self._ops.execute(sql, args)

    async def fetch(self, sql: str, *args: Any) -> list[Any]:
        """The rows ``sql`` answers (as ``execute``)."""
        return await self.execute(sql, *args)

    async def fetchrow(self, sql: str, *args: Any) -> Any | None:
        """The first row ``sql`` answers, or None."""
        rows = await self.execute(sql, *args)
        return rows[0] if rows else None

    async def fetchval(self, sql: str, *args: Any) -> Any:
        """The first column of the first row ``sql`` answers, or None."""
        row = await self.fetchrow(sql, *args)
        return None if row is None else row[0]


def current_transaction() -> Transaction | None:
    """The transaction the calling task runs in, if it opened one with ``transaction()``."""
    return _current.get()


def joined(connection: object | None) -> object | None:
    """``connection=`` as given, else the current transaction (None outside any)."""
    return _current.get() if connection is None else connection


def unwrap(connection: object | None) -> tuple[object | None, Transaction | None]:
    """A driver's view of ``connection=``: the raw connection to write through, and the
    ``Transaction`` it came in (None when the caller passed a connection of its own)."""
    if isinstance(connection, Transaction):
        return connection.connection, connection
    return connection, None


def has_transactions(driver: object) -> bool:
    """Whether ``transaction(driver)`` opens one on the driver itself (SQLite, PostgreSQL; not
    the memory driver, nor an Outbox, which writes in the application's)."""
    return getattr(driver, "open_transaction", None) is not None


@contextlib.asynccontextmanager
async def transaction(target: object) -> AsyncIterator[Transaction]:
    """Open a transaction and make it the current one for the block.

    ``target`` is a driver: the PostgreSQL driver (a connection of its own pool, held for the
    block) or the SQLite driver (its own connection); or the application's own: an asyncpg
    connection or pool opened on the driver's trio-asyncio loop, a ``sqlite3`` connection to
    the SQLite driver's file (``check_same_thread=False``: its statements run in worker
    threads). The block commits when it ends normally and rolls back when it raises or is
    cancelled: the application's rows and the jobs enqueued in it land together or not at all.
    A connection already inside a transaction is joined, not owned: committing stays yours."""
    current = _current.get()
    if current is not None and current.step is not None:
        # Its writes would commit apart from the step's record: done again when the step runs
        # again (PostgreSQL: another connection of the pool; SQLite: the step's own connection,
        # which would fail as a lock re-acquired).
        raise StepError(
            f"jobs_trio.transaction() was opened inside the function of"
            f" step.transaction({current.step!r})",
            fix="write through the function's tx (enqueue and send_event join it): a block of"
            " its own commits apart from the step, so its writes would not happen exactly once",
        )
    opener = getattr(target, "open_transaction", None)
    if opener is not None:  # has_transactions(target)
        async with opener() as tx:
            with _marked(tx):
                yield tx
        return
    async with _connection_of(target) as connection:
        tx = Transaction(connection, ops_for(connection))
        async with owned(tx):
            with _marked(tx):
                yield tx


@contextlib.asynccontextmanager
async def _connection_of(target: object) -> AsyncIterator[object]:
    """``target`` itself, or a connection acquired from it for the block when it is an asyncpg
    pool: released shielded and bounded, so a cancelled block never leaks it (STACK-NOTES)."""
    if not (_is_asyncpg(target) and callable(getattr(target, "acquire", None))):
        yield target
        return
    pool: Any = target
    loop = getattr(pool, "_loop", None)
    connection = await _cross(loop, pool.acquire)
    try:
        yield connection
    finally:
        await _release(loop, pool, connection)


async def _release(loop: Any, pool: Any, connection: Any) -> None:
    with trio.CancelScope(shield=True):
        with trio.move_on_after(ROLLBACK_SECONDS):
            try:
                await _cross(loop, pool.release, connection)
                return
            except Exception as exc:
                log_event("jobs.transaction.release-failed", error=repr(exc))
        connection.terminate()  # the pool replaces a terminated connection


def _is_asyncpg(target: object) -> bool:
    return type(target).__module__.startswith("asyncpg")


async def _cross(loop: Any, fn: Callable[..., Any], *args: Any) -> Any:
    import trio_asyncio

    return await trio_asyncio.aio_as_trio(fn, loop=loop)(*args)


@contextlib.contextmanager
def _marked(tx: Transaction) -> Iterator[None]:
    token = _current.set(tx)
    try:
        yield
    finally:
        _current.reset(token)


@contextlib.asynccontextmanager
async def owned(tx: Transaction) -> AsyncIterator[Transaction]:
    """Begin ``tx`` (unless its connection is already in one), commit it after the block, roll
    it back when the block fails; then run its after-commit work."""
    if await tx._ops.in_transaction():
        yield tx  # the application's own transaction: it commits, and wakes come by the poll
        return
    await tx._ops.begin()
    tx.owned = True
    try:
        yield tx
    except BaseException:
        # Shielded: a cancelled block must still end its transaction, or the connection stays
        # inside it (asyncpg: aborted and unusable; SQLite: holding the file's write lock).
        with trio.CancelScope(shield=True):
            await tx._ops.rollback()
        raise
    await tx._ops.commit()
    for fn in tx._after_commit:
        try:
            fn()
        except Exception as exc:  # a wake-up that failed must not turn a commit into an error
            log_event("jobs.transaction.after-commit-failed", error=repr(exc))


def ops_for(connection: object) -> _Ops:
    if isinstance(connection, sqlite3.Connection):
        return SqliteOps(connection)
    if _is_asyncpg(connection):
        return _AsyncpgOps(connection)
    raise ConfigError(
        f"jobs_trio.transaction() cannot open a transaction on a {type(connection).__name__}",
        fix="pass the driver (PostgreSQL or SQLite), an asyncpg connection or pool, or a"
        " sqlite3 connection to the SQLite driver's file",
    )


class SqliteOps:
    """A ``sqlite3`` connection driven from worker threads (one statement per crossing)."""

    def __init__(
        self,
        conn: sqlite3.Connection,
        *,
        limiter: trio.CapacityLimiter | None = None,
        busy_timeout: float = 0.0,
        lending: Callable[[], contextlib.AbstractContextManager[None]] = contextlib.nullcontext,
    ) -> None:
        self.conn = conn
        self._limiter = limiter
        # The SQLite door's GIL handoff, for the driver's own connection (_gil_handoff.py).
        self._lending = lending
        # Beyond the connection's own timeout: the SQLite driver's connection waits only a
        # short slice per statement (so a cancel is heard) and retries the rest from Trio.
        self._busy_timeout = busy_timeout

    async def _run(self, fn: Callable[[], Any]) -> Any:
        try:
            with self._lending():
                return await trio.to_thread.run_sync(fn, limiter=self._limiter)
        except sqlite3.ProgrammingError as exc:
            if "thread" not in str(exc):
                raise
            raise ConfigError(
                f"the sqlite3 connection cannot be used from jobs_trio's threads: {exc}",
                fix="open it with sqlite3.connect(path, check_same_thread=False)",
            ) from exc

    async def in_transaction(self) -> bool:
        return await self._run(lambda: self.conn.in_transaction)  # type: ignore[no-any-return]

    async def begin(self) -> None:
        # IMMEDIATE: the write lock now, so the block's writes never fail half-way with BUSY
        # on a lock upgrade another writer holds (that failure has no retry inside a block).
        deadline = trio.current_time() + self._busy_timeout
        while True:
            try:
                await self._run(lambda: self.conn.execute("BEGIN IMMEDIATE"))
                return
            except sqlite3.OperationalError as exc:
                busy = getattr(exc, "sqlite_errorcode", 0) & 0xFF == sqlite3.SQLITE_BUSY
                if not busy or trio.current_time() >= deadline:
                    raise
            await trio.sleep(0.01)  # another writer holds the file: look again shortly

    async def commit(self) -> None:
        # Shielded, as on PostgreSQL (_postgres_transaction.py): the block ended normally, so
        # its writes are to land. A cancel already pending would otherwise stop the COMMIT
        # before its thread starts, leaving the connection inside the transaction, holding
        # the file's write lock, with the caller not knowing whether its writes had landed.
        with trio.CancelScope(shield=True):
            await self._run(self.conn.commit)

    async def rollback(self) -> None:
        await self._run(self.conn.rollback)

    async def execute(self, sql: str, args: Sequence[Any]) -> list[Any]:
        return await self._run(lambda: self.conn.execute(sql, tuple(args)).fetchall())  # type: ignore[no-any-return]


class _AsyncpgOps:
    """An asyncpg connection, crossed into from Trio on the loop it was opened on."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        # asyncpg keeps the loop a connection belongs to; every statement must run there.
        self._loop = getattr(conn, "_loop", None)

    async def _cross(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await _cross(self._loop, fn, *args)

    async def in_transaction(self) -> bool:
        await trio.lowlevel.checkpoint()
        return bool(self.conn.is_in_transaction())

    async def begin(self) -> None:
        await self._cross(self.conn.execute, "BEGIN")

    async def commit(self) -> None:
        await self._cross(self.conn.execute, "COMMIT")

    async def rollback(self) -> None:
        with trio.move_on_after(ROLLBACK_SECONDS):
            try:
                await self._cross(self.conn.execute, "ROLLBACK")
                return
            except Exception as exc:
                log_event("jobs.transaction.rollback-failed", error=repr(exc))
        # Failed or timed out: a connection left in an aborted transaction would fail the
        # application's next statement in a way that names nothing; closing it says "closed".
        self.conn.terminate()

    async def execute(self, sql: str, args: Sequence[Any]) -> list[Any]:
        return list(await self._cross(self.conn.fetch, sql, *args))
