# A producer's write from asyncio: the PostgreSQL plan on asyncpg (the application's connection,
# or a pool of the producer's own) or on psycopg's async connection, and SQLite's writes in a
# worker thread (asyncio.to_thread), in the caller's transaction or in one of their own. Apart
# from blocking.py because every call here is awaited on the application's event loop.
from __future__ import annotations

import asyncio
import contextlib
import functools
import sqlite3
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from ..drivers._postgres_plan import Plan, Query, Rows, fetch_on, run_plan_async
from ..drivers._sqlite_enqueue import end_savepoint
from ..drivers._sqlite_enqueue import joins_callers as sqlite_joins_callers
from .callers import Client, joins_callers
from .failures import postgres_failure, postgres_failures
from .stores import PostgresStore

_SAVEPOINT = "jobs_trio_write"

# A cancelled write on the caller's sqlite3 connection interrupts its statement again this
# often until its thread has let go: an interrupt between two statements does nothing.
_INTERRUPT_AGAIN = 0.05

T = TypeVar("T")

Fetch = Callable[[Query], Awaitable[Rows]]


def psycopg_async_fetch(cursor: Any) -> Fetch:
    """A plan's fetch on psycopg's async raw cursor (``$n`` placeholders, as the driver's)."""

    async def fetch(query: Query) -> Rows:
        await cursor.execute(query.sql, query.args)
        return list(await cursor.fetchall()) if cursor.description is not None else []

    return fetch


async def guarded(fetch: Fetch, plan: Plan, *, joined: bool) -> Any:
    """``plan`` on the caller's connection, in a savepoint of its transaction (``joined``) or in
    a transaction of its own, so that a cancel never leaves the caller's transaction broken nor
    a cancelled job in it: an await that raised wrote nothing, one that answered wrote its job.

    The plan runs as a task of its own. A cancel of the caller's await is passed to it while
    its plan runs (a statement in flight, a lock wait, is cancelled on the server), and it is
    then waited out while it undoes what it wrote, so the caller's connection is handed back
    between statements, its transaction as it was. Cut short on its own, a statement's cancel
    left the connection busy, the rollback to the savepoint was refused and passed over, and a
    timed-out job stayed in a transaction its caller then committed (18 of 53 on asyncpg, 24
    of 68 on psycopg). The BEGIN or SAVEPOINT is never cut short: whether it ran would not be
    known, and a rollback to a savepoint that is not there fails the caller's transaction (a
    BEGIN cut short left an asyncpg connection in a transaction no one committed).

    The write ends with the savepoint's RELEASE (or its COMMIT). A cancel that comes during
    that last round trip comes too late: the write is kept, and its answer returned rather than
    the cancel raised, as a caller that sees the cancel would take the job for not written.
    (Left open instead, the savepoints of a transaction's enqueues nested one inside the
    other, thousands deep, and a backend walking them crashed the server.)"""
    begin, end, undo = (
        (
            f"SAVEPOINT {_SAVEPOINT}",
            f"RELEASE SAVEPOINT {_SAVEPOINT}",
            (f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}", f"RELEASE SAVEPOINT {_SAVEPOINT}"),
        )
        if joined
        else ("BEGIN", "COMMIT", ("ROLLBACK",))
    )
    planning = False  # the one stretch a cancel is passed into
    stop = False  # the caller's await was cancelled: no plan starts, no end is sent, after this

    async def undone() -> None:
        with contextlib.suppress(Exception):  # a broken connection has nothing to undo
            for sql in undo:
                await fetch(Query(sql, ()))

    async def write() -> Any:
        nonlocal planning
        begun = asyncio.ensure_future(fetch(Query(begin, ())))
        cut = False
        try:
            await asyncio.shield(begun)
        except asyncio.CancelledError:
            # This task cancelled itself (an ending asyncio.run cancels every task): its BEGIN or
            # SAVEPOINT is let finish, then undone.
            await _waited_out(begun)
            cut = True
        begun.result()  # the statement's own failure: nothing to undo
        try:
            if stop or cut:
                raise asyncio.CancelledError
            planning = True
            answer = await run_plan_async(plan, fetch)
            planning = False
            if stop:  # cancelled as the plan's last answer came: not kept
                raise asyncio.CancelledError
            await fetch(Query(end, ()))
        except BaseException:
            planning = False
            # Its own task: a cancel that comes while this undoes must not cut the undo short
            # (a failed statement's transaction stays failed until it is done).
            await _waited_out(asyncio.ensure_future(undone()))
            raise
        return answer

    written = asyncio.ensure_future(write())
    try:
        return await asyncio.shield(written)
    except asyncio.CancelledError:
        stop = True
        if planning:
            written.cancel()
        await _waited_out(written)
        if written.cancelled() or written.exception() is not None:
            raise
        return written.result()  # it had sent its end: the cancel came too late


async def _waited_out(task: asyncio.Future[Any]) -> None:
    """Wait until ``task`` is done, whatever cancels come meanwhile (the caller's cancel is
    raised once it is: its connection is not handed back while a statement is on it)."""
    while not task.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait({task})


class Turns:
    """One write of this producer at a time on each caller's connection. The write's
    savepoint (and on sqlite3 its end, on the loop) must not interleave another's on the same
    connection: a cancelled one's rollback undid the other's savepoint, whose release then
    kept the cancelled one's job (two enqueues gathered on one connection, one timed out).
    Keyed by the connection's id while a write on it is in flight or waiting, and holding the
    connection meanwhile, so that no id is reused (a sqlite3 connection has no weak
    reference)."""

    def __init__(self) -> None:
        self._held: dict[int, tuple[object, asyncio.Lock, list[int]]] = {}

    @contextlib.asynccontextmanager
    async def of(self, conn: object) -> AsyncIterator[None]:
        key = id(conn)
        entry = self._held.get(key)
        if entry is None:
            entry = self._held[key] = (conn, asyncio.Lock(), [0])
        _, lock, waiting = entry
        waiting[0] += 1
        try:
            async with lock:
                yield
        finally:
            waiting[0] -= 1
            if not waiting[0]:
                del self._held[key]


async def write_postgres(
    store: PostgresStore, client: Client, conn: Any, plan: Plan, *, where: str
) -> Any:
    """``plan`` (a write's, the schema's check) on an asyncpg or psycopg async connection: inside
    its transaction, or in one of its own (callers.joins_callers); see ``guarded``."""
    joined = joins_callers(client, conn)
    with postgres_failures(where=where, schema=store.sql.schema):
        if client is Client.ASYNCPG:
            return await guarded(functools.partial(fetch_on, conn), plan, joined=joined)
        import psycopg

        cursor = psycopg.AsyncRawCursor(conn)
        try:
            return await guarded(psycopg_async_fetch(cursor), plan, joined=joined)
        finally:
            await cursor.close()


async def on_callers_sqlite(
    conn: sqlite3.Connection, write: Callable[[bool, threading.Event], T]
) -> T:
    """``write`` (on the application's sqlite3 connection ``conn``) in a worker thread
    (``sqlite_in_thread``). ``write(leave_open, cancelled)``: in the caller's transaction, the
    thread leaves its savepoint open and it is ended here, on the loop's thread, where no
    cancel can come between the look and the end: released when the await was not cancelled,
    rolled back when it was. (Released in the thread, a cancel that came after the release, 28
    of 42 timeouts in tests/produce/test_aio_cancel.py, reached a caller whose transaction held
    the job, which its commit then wrote.) Its statement is left to finish, never interrupted:
    SQLite rolls an interrupted INSERT's whole transaction back, the caller's own rows with it,
    and the caller's COMMIT then says nothing. A transaction of the write's own (a connection in
    autocommit) is interrupted."""
    joined = sqlite_joins_callers(conn)
    answer, cancelled = await sqlite_in_thread(
        functools.partial(write, joined), interrupt=None if joined else conn.interrupt
    )
    if joined:  # written, its savepoint still open
        if cancelled:
            # Undone, so the caller's transaction holds none of it (a failure here leaves it
            # to the caller's rollback, which a cancel brings).
            with contextlib.suppress(sqlite3.Error):
                end_savepoint(conn, keep=False)
            raise asyncio.CancelledError
        end_savepoint(conn, keep=True)
    return answer


async def sqlite_in_thread(
    write: Callable[[threading.Event], T], *, interrupt: Callable[[], None] | None
) -> tuple[T, bool]:
    """``write(cancelled)`` in a worker thread, and whether the caller's await was cancelled
    meanwhile. A cancel is passed on only once the thread has let go of its connection: asyncio
    alone would hand the caller its connection back while the thread still wrote on it (and the
    caller's rollback, landing between two of the write's statements, left the rest to commit
    with its next transaction), or let a write of the producer's own commit after its await
    raised. Meanwhile ``cancelled`` is set (a transaction of the write's own is rolled back
    rather than committed: write_in) and ``interrupt`` called every 50 ms. A write that ended
    so (``WriteCancelled``) raises the cancel; one that committed before the cancel could
    stop it came too late, and its answer stands. SQLite's busy wait is not interruptible: a
    write waiting for the file's lock is waited out, up to its connection's busy timeout. The
    thread's future is not a task, so that an ``asyncio.run`` ending cancels the caller, not
    the wait for the thread."""
    cancelled = threading.Event()
    thread = asyncio.get_running_loop().run_in_executor(None, write, cancelled)
    try:
        return await asyncio.shield(thread), False
    except asyncio.CancelledError:
        cancelled.set()
        while not thread.done():
            if interrupt is not None:
                interrupt()
            with contextlib.suppress(asyncio.CancelledError):  # a second cancel: same wait
                await asyncio.wait({thread}, timeout=_INTERRUPT_AGAIN)
        if thread.cancelled() or thread.exception() is not None:
            raise
        return thread.result(), True


async def open_pool(store: PostgresStore, size: int) -> Any:
    """The asyncio producer's own connections: an asyncpg pool on the running loop."""
    import asyncpg

    sets = store.session_sets()

    async def init(conn: Any) -> None:
        if sets is not None:
            await conn.execute(sets)

    try:
        return await asyncpg.create_pool(
            min_size=0, max_size=size, init=init, **store.asyncpg_options()
        )
    except Exception as exc:
        mapped = postgres_failure(exc, where=store.shown, schema=store.sql.schema)
        raise (mapped or exc) from exc
