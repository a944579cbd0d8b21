# jobs_trio.aio: enqueue jobs and send events from asyncio code (a FastAPI or Starlette
# endpoint, an aiohttp handler) into the SQLite file or PostgreSQL schema the Trio workers use:
# the same checks, rows and SQL as JobDefinition.enqueue, on the application's own event loop.
"""Producers for asyncio code.

``Producer(url)`` writes jobs and events to the store ``url`` names (``sqlite:///...`` or
``postgresql://...``, as the workers' ``open_driver``): on an asyncpg pool of its own (SQLite:
in a worker thread), or inside the application's transaction with ``connection=`` (an asyncpg
connection, a psycopg 3 ``AsyncConnection``, or a ``sqlite3`` connection to the same file opened
with ``check_same_thread=False``): the job then exists if and only if that transaction commits.
Nothing here imports trio-asyncio: the application's loop stays as it is.
See docs/howto-producers.md."""

from __future__ import annotations

import asyncio
import functools
import sqlite3
import time
from collections.abc import Iterable
from types import TracebackType
from typing import Any, TypeVar, Unpack, overload

from ._core.boundary import check_int
from ._core.records import JobId
from ._jobs.events import event_text
from ._jobs.registry import EnqueueManyOptions, EnqueueOptions, JobDefinition
from ._produce.awaiting import (
    Turns,
    on_callers_sqlite,
    open_pool,
    sqlite_in_thread,
    write_postgres,
)
from ._produce.blocking import write_sqlite, write_sqlite_own
from ._produce.callers import Client, client_of, wrong_client
from ._produce.keeper import Keeper
from ._produce.stores import PostgresStore, SqliteStore, store_for
from ._produce.writes import EventWrite, Write, many_jobs, one_job, one_job_answer
from .drivers._postgres_migrate import judge_schema, recorded_plan

__all__ = ["Producer"]

P = TypeVar("P")


class Producer:
    """Enqueue jobs and send events from asyncio code, on one event loop.

    ``url``: the workers' store (``sqlite:///path/jobs.db`` or ``postgresql://...``, with the
    driver's URL options); ``schema``: the PostgreSQL schema the workers use; ``pool_size``:
    the most connections of its own open at once (PostgreSQL). Nothing connects until the
    first call; the store is checked to be migrated once. Close it with ``aclose()`` (or
    ``async with``), e.g. in a FastAPI lifespan."""

    def __init__(
        self,
        url: str,
        *,
        schema: str = "jobs_trio",
        busy_timeout: float = 5.0,
        pool_size: int = 4,
    ) -> None:
        # The connections it keeps: checked here, where it is given (0 failed at the first
        # write, with no code).
        pool_size = check_int(pool_size, argument="pool_size", low=1, high=1000)
        self._store = store_for(url, schema=schema, busy_timeout=busy_timeout)
        self._pool_size = pool_size
        self._pool: Any = None
        self._pool_lock = asyncio.Lock()
        self._turns = Turns()
        self._checked = False
        store = self._store
        self._sqlite: Keeper[sqlite3.Connection] | None = (
            Keeper(store.connect, sqlite3.Connection.close, keep=pool_size)
            if isinstance(store, SqliteStore)
            else None
        )

    async def __aenter__(self) -> Producer:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the producer's own connections."""
        if self._sqlite is not None:
            await asyncio.to_thread(self._sqlite.close)
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()

    # Without a payload the body is handed None: only a body whose payload accepts None may be
    # enqueued so (the first overload); any other takes its payload type and nothing else. The
    # options are JobDefinition.enqueue's, declared once (EnqueueOptions) for both producers.
    @overload
    async def enqueue(
        self, job: JobDefinition[None, Any], payload: None = None, **options: Unpack[EnqueueOptions]
    ) -> JobId: ...

    @overload
    async def enqueue(
        self, job: JobDefinition[P, Any], payload: P, **options: Unpack[EnqueueOptions]
    ) -> JobId: ...

    async def enqueue(
        self, job: JobDefinition[Any, Any], payload: Any = None, **options: Unpack[EnqueueOptions]
    ) -> JobId:
        """``JobDefinition.enqueue`` for asyncio code: write one job, answer its id (a live
        job's id when it holds ``key``; ``DuplicateJob`` with ``on_duplicate="raise"``)."""
        [answer] = await self._write(one_job(job, payload, options), options.get("connection"))
        return one_job_answer(job, answer, options)

    async def enqueue_many(
        self,
        job: JobDefinition[P, Any],
        payloads: Iterable[P],
        **options: Unpack[EnqueueManyOptions],
    ) -> list[JobId]:
        """``JobDefinition.enqueue_many`` for asyncio code: every payload checked before
        anything is written, then all written in one transaction."""
        write = many_jobs(job, payloads, options)
        if not write.jobs:
            return []
        return [answer.job_id for answer in await self._write(write, options.get("connection"))]

    async def send_event(
        self,
        name: str,
        payload: Any = None,
        *,
        key: str | None = None,
        connection: object | None = None,
    ) -> str:
        """``jobs_trio.send_event`` for asyncio code: store the event and wake the jobs
        suspended on it (with ``key``, those waiting for that key or any); answer its id."""
        event_id: str = await self._write(
            EventWrite(name, event_text(name, payload, key), key), connection
        )
        return event_id

    async def _write(self, write: Write, connection: object | None) -> Any:
        store = self._store
        if isinstance(store, SqliteStore):
            if connection is None:
                # Each new connection's file is checked as it opens (SqliteStore.connect).
                assert self._sqlite is not None
                answer, _ = await sqlite_in_thread(
                    functools.partial(write_sqlite_own, store, self._sqlite, write),
                    interrupt=None,
                )
                return answer
            client, conn = client_of(connection)
            if client is not Client.SQLITE:
                raise wrong_client(client, "a SQLite store", "a sqlite3 connection to its file")
            await self._check_sqlite(store)
            async with self._turns.of(conn):
                return await on_callers_sqlite(
                    conn,
                    lambda leave_open, cancelled: write_sqlite(
                        store, conn, write, own=False, leave_open=leave_open, cancelled=cancelled
                    ),
                )
        if connection is None:
            pool = await self._own_pool(store)
            async with pool.acquire() as conn:
                return await self._write_postgres(store, Client.ASYNCPG, conn, write, store.shown)
        client, conn = client_of(connection)
        if client not in (Client.ASYNCPG, Client.PSYCOPG_ASYNC):
            raise wrong_client(
                client,
                "PostgreSQL from asyncio code",
                "an asyncpg connection or a psycopg (3) AsyncConnection",
            )
        async with self._turns.of(conn):
            return await self._write_postgres(store, client, conn, write, "the caller's connection")

    async def _write_postgres(
        self, store: PostgresStore, client: Client, conn: Any, write: Write, where: str
    ) -> Any:
        """The schema checked (once: not migrated, or migrated by a newer release, is refused),
        then ``write``, each guarded against a cancel as a write is (awaiting.guarded): the
        check's statements on the caller's connection are in its transaction too."""
        if not self._checked:
            recorded = await write_postgres(
                store, client, conn, recorded_plan(store.sql), where=where
            )
            judge_schema(store.sql, recorded)
            self._checked = True
        plan = write.plan(store.sql, time.time())
        return await write_postgres(store, client, conn, plan, where=where)

    async def _own_pool(self, store: PostgresStore) -> Any:
        async with self._pool_lock:
            if self._pool is None:
                self._pool = await open_pool(store, self._pool_size)
            return self._pool

    async def _check_sqlite(self, store: SqliteStore) -> None:
        if not self._checked:
            await asyncio.to_thread(store.check)
            self._checked = True
