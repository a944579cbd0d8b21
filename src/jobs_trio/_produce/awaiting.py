# A producer's write from asyncio: the PostgreSQL plan on asyncpg (the application's connection,
# or a pool of the producer's own) or on psycopg's async connection, and SQLite's writes in a
# worker thread (asyncio.to_thread), in the caller's transaction or in one of their own. Apart
# from blocking.py because every call here is awaited on the application's event loop.
from __future__ import annotations

import asyncio
import contextlib
import functools
import sqlite3
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from ..drivers._postgres_plan import Plan, Query, Rows, fetch_on, run_plan_async
from ..drivers._sqlite_enqueue import end_savepoint
from ..drivers._sqlite_enqueue import joins_callers as sqlite_joins_callers
from .callers import Client, joins_callers
from .failures import postgres_failure, postgres_failures
from .stores import PostgresStore
from .writes import Write

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


async def in_savepoint(fetch: Fetch, plan: Plan) -> Any:
    """``plan`` inside a savepoint of the caller's transaction: a failure undoes only these
    writes, and the caller's transaction goes on. A cancel never cuts a statement short: the
    client would cancel it on the server, and the rollback to the savepoint that followed was
    refused (another operation in progress) and passed over, so a timed-out enqueue's job
    (18 of 53 in tests/produce/test_aio_cancel.py) stayed in a transaction its caller then
    committed. The write is waited out instead, then undone when it succeeded. So an await that
    raised wrote nothing, and one that answered an id wrote its job into the transaction."""

    async def undo() -> None:
        with contextlib.suppress(Exception):  # a broken connection has nothing to undo
            await fetch(Query(f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}", ()))
            await fetch(Query(f"RELEASE SAVEPOINT {_SAVEPOINT}", ()))

    async def write() -> Any:
        await fetch(Query(f"SAVEPOINT {_SAVEPOINT}", ()))
        try:
            return await run_plan_async(plan, fetch)
        except BaseException:
            await undo()
            raise

    written = asyncio.ensure_future(write())
    try:
        answer = await asyncio.shield(written)
    except asyncio.CancelledError:
        await _waited_out(written)
        if not written.cancelled() and written.exception() is None:
            await _waited_out(asyncio.ensure_future(undo()))
        raise
    released = asyncio.ensure_future(fetch(Query(f"RELEASE SAVEPOINT {_SAVEPOINT}", ())))
    try:
        await asyncio.shield(released)
    except asyncio.CancelledError:
        await _waited_out(released)  # the connection is the caller's: never left mid-statement
        if released.cancelled() or released.exception() is not None:
            raise
        # Released: the job is in the caller's transaction, and nothing can take it out but
        # the whole transaction. A cancel raised now would tell a caller that goes on to
        # commit (a handler that logs its timeout) that nothing was written: it came too late,
        # and the id is answered as if it had come after (asyncio.timeout and wait_for then
        # return it; an anyio scope cancels again at the caller's next await).
    return answer


async def _waited_out(task: asyncio.Future[Any]) -> None:
    """Wait until ``task`` is done, whatever cancels come meanwhile (the caller's cancel is
    raised once it is: its connection is not handed back while a statement is on it)."""
    while not task.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait({task})


async def write_postgres(
    store: PostgresStore, client: Client, conn: Any, write: Write, *, where: str
) -> Any:
    """``write`` on an application's asyncpg or psycopg async connection: inside its
    transaction, or in one of its own (callers.joins_callers)."""
    plan = write.plan(store.sql, time.time())
    with postgres_failures(where=where, schema=store.sql.schema):
        if client is Client.ASYNCPG:
            fetch: Fetch = functools.partial(fetch_on, conn)
            if joins_callers(client, conn):
                return await in_savepoint(fetch, plan)
            async with conn.transaction():
                return await run_plan_async(plan, fetch)
        import psycopg

        async with contextlib.AsyncExitStack() as stack:
            cursor = psycopg.AsyncRawCursor(conn)
            stack.push_async_callback(cursor.close)
            fetch = psycopg_async_fetch(cursor)
            if joins_callers(client, conn):
                return await in_savepoint(fetch, plan)
            async with conn.transaction():
                return await run_plan_async(plan, fetch)


async def on_callers_sqlite(conn: sqlite3.Connection, write: Callable[[bool], T]) -> T:
    """``write`` (on the application's sqlite3 connection ``conn``) in a worker thread. A
    cancel is passed on only once the thread has let go of ``conn``: asyncio alone would hand
    the caller its connection back while the thread still wrote on it, and the caller's
    rollback, landing between two of the write's statements, would leave the rest to commit
    with its next transaction (a job of a cancelled request).

    ``write(leave_open)``: in the caller's transaction, the thread leaves its savepoint open
    and it is ended here, on the loop's thread, where no cancel can come between the look and
    the end: released when the await was not cancelled, rolled back when it was. (Released in
    the thread, a cancel that came after the release, 28 of 42 timeouts in
    tests/produce/test_aio_cancel.py, reached a caller whose transaction held the job, which
    its commit then wrote.) Its statement is left to finish, never interrupted: SQLite rolls
    an interrupted INSERT's whole transaction back, the caller's own rows with it, and the
    caller's COMMIT then says nothing. A transaction of the write's own (a connection in
    autocommit) is interrupted meanwhile (SQLite's busy wait is not interruptible: a write
    waiting for the file's lock is waited out, up to the connection's busy timeout)."""
    joined = sqlite_joins_callers(conn)
    thread = asyncio.ensure_future(asyncio.to_thread(write, joined))
    try:
        answer = await asyncio.shield(thread)
    except asyncio.CancelledError:
        while not thread.done():
            if not joined:
                conn.interrupt()
            with contextlib.suppress(asyncio.CancelledError):  # a second cancel: same wait
                await asyncio.wait({thread}, timeout=_INTERRUPT_AGAIN)
        if not thread.cancelled() and thread.exception() is None and joined:
            # Written, savepoint still open: undone, so the caller's transaction holds none of
            # it. A failure here leaves it to the caller's rollback, which a cancel brings.
            with contextlib.suppress(sqlite3.Error):
                end_savepoint(conn, keep=False)
        raise
    if joined:
        end_savepoint(conn, keep=True)
    return answer


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
