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
    writes, and the caller's transaction goes on."""
    await fetch(Query(f"SAVEPOINT {_SAVEPOINT}", ()))
    try:
        answer = await run_plan_async(plan, fetch)
    except BaseException:
        with contextlib.suppress(Exception):  # a broken connection has nothing to undo
            await fetch(Query(f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}", ()))
            await fetch(Query(f"RELEASE SAVEPOINT {_SAVEPOINT}", ()))
        raise
    await fetch(Query(f"RELEASE SAVEPOINT {_SAVEPOINT}", ()))
    return answer


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


async def on_callers_sqlite(conn: sqlite3.Connection, write: Callable[[], T]) -> T:
    """``write`` (on the application's sqlite3 connection ``conn``) in a worker thread. A
    cancel is passed on only once the thread has let go of ``conn``: asyncio alone would hand
    the caller its connection back while the thread still wrote on it, and the caller's
    rollback, landing between two of the write's statements, would leave the rest to commit
    with its next transaction (a job of a cancelled request). The statement is interrupted
    meanwhile, and its savepoint rolled back (SQLite's busy wait is not interruptible: a write
    waiting for the file's lock is waited out, up to the connection's busy timeout)."""
    thread = asyncio.ensure_future(asyncio.to_thread(write))
    try:
        return await asyncio.shield(thread)
    except asyncio.CancelledError:
        while not thread.done():
            conn.interrupt()
            with contextlib.suppress(asyncio.CancelledError):  # a second cancel: same wait
                await asyncio.wait({thread}, timeout=_INTERRUPT_AGAIN)
        if not thread.cancelled():
            thread.exception()  # interrupted, most likely: the cancel is what the caller sees
        raise


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
