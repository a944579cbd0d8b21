# jobs_trio.sync: enqueue jobs and send events from blocking code (a Django view, a Flask
# handler, a management command, a script) into the SQLite file or PostgreSQL schema the Trio
# workers use: the same checks, rows and SQL as JobDefinition.enqueue, no Trio needed.
"""Producers for blocking code.

``Producer(url)`` writes jobs and events to the store ``url`` names (``sqlite:///...`` or
``postgresql://...``, as the workers' ``open_driver``), on connections of its own, or inside
the application's transaction with ``connection=`` (a ``sqlite3`` connection to the same file,
a psycopg 3 connection, or Django's ``django.db.connection``): the job then exists if and only
if that transaction commits. See docs/howto-producers.md."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from types import TracebackType
from typing import Any, TypeVar, Unpack, overload

from ._core.boundary import check_int
from ._core.records import JobId
from ._jobs.events import event_text
from ._jobs.registry import EnqueueManyOptions, EnqueueOptions, JobDefinition
from ._produce.blocking import (
    STALE,
    connect_psycopg,
    psycopg_fetch,
    write_psycopg,
    write_psycopg_own,
    write_sqlite,
    write_sqlite_own,
)
from ._produce.callers import Client, client_of, wrong_client
from ._produce.failures import postgres_failures
from ._produce.keeper import Keeper
from ._produce.stores import PostgresStore, SqliteStore, store_for
from ._produce.writes import EventWrite, Write, many_jobs, one_job, one_job_answer
from .drivers._postgres_migrate import judge_schema, recorded_plan
from .drivers._postgres_plan import run_plan

__all__ = ["Producer"]

P = TypeVar("P")


class Producer:
    """Enqueue jobs and send events from blocking code; safe to share between threads.

    ``url``: the workers' store (``sqlite:///path/jobs.db`` or ``postgresql://...``, with the
    driver's URL options); ``schema``: the PostgreSQL schema the workers use. Nothing connects
    until the first call; the store is checked to be migrated once. ``keep``: how many of its
    own connections stay open between calls (``close()`` closes them)."""

    def __init__(
        self,
        url: str,
        *,
        schema: str = "jobs_trio",
        busy_timeout: float = 5.0,
        keep: int = 2,
    ) -> None:
        # The connections it keeps: checked here, where it is given (0 failed at the first
        # write, with no code).
        keep = check_int(keep, argument="keep", low=0, high=1000)
        self._store = store_for(url, schema=schema, busy_timeout=busy_timeout)
        self._checked = False
        store = self._store
        if isinstance(store, SqliteStore):
            self._sqlite: Keeper[sqlite3.Connection] | None = Keeper(
                store.connect, sqlite3.Connection.close, keep=keep
            )
            self._psycopg: Keeper[Any] | None = None
        else:
            self._sqlite = None
            self._psycopg = Keeper(lambda: connect_psycopg(store), _close, keep=keep)

    def __enter__(self) -> Producer:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the connections kept between calls."""
        for keeper in (self._sqlite, self._psycopg):
            if keeper is not None:
                keeper.close()

    # Without a payload the body is handed None: only a body whose payload accepts None may be
    # enqueued so (the first overload); any other takes its payload type and nothing else. The
    # options are JobDefinition.enqueue's, declared once (EnqueueOptions) for both producers.
    @overload
    def enqueue(
        self, job: JobDefinition[None, Any], payload: None = None, **options: Unpack[EnqueueOptions]
    ) -> JobId: ...

    @overload
    def enqueue(
        self, job: JobDefinition[P, Any], payload: P, **options: Unpack[EnqueueOptions]
    ) -> JobId: ...

    def enqueue(
        self, job: JobDefinition[Any, Any], payload: Any = None, **options: Unpack[EnqueueOptions]
    ) -> JobId:
        """``JobDefinition.enqueue`` for blocking code: write one job, answer its id (a live
        job's id when it holds ``key``; ``DuplicateJob`` with ``on_duplicate="raise"``)."""
        [answer] = self._write(one_job(job, payload, options), options.get("connection"))
        return one_job_answer(job, answer, options)

    def enqueue_many(
        self,
        job: JobDefinition[P, Any],
        payloads: Iterable[P],
        **options: Unpack[EnqueueManyOptions],
    ) -> list[JobId]:
        """``JobDefinition.enqueue_many`` for blocking code: every payload checked before
        anything is written, then all written in one transaction."""
        write = many_jobs(job, payloads, options)
        if not write.jobs:
            return []
        return [answer.job_id for answer in self._write(write, options.get("connection"))]

    def send_event(
        self,
        name: str,
        payload: Any = None,
        *,
        key: str | None = None,
        connection: object | None = None,
    ) -> str:
        """``jobs_trio.send_event`` for blocking code: store the event and wake the jobs
        suspended on it (with ``key``, those waiting for that key or any); answer its id."""
        event_id: str = self._write(
            EventWrite(name, event_text(name, payload, key), key), connection
        )
        return event_id

    def _write(self, write: Write, connection: object | None) -> Any:
        store = self._store
        if connection is None:
            return self._write_own(write)
        client, conn = client_of(connection)
        if isinstance(store, SqliteStore):
            if client is not Client.SQLITE:
                raise wrong_client(client, "a SQLite store", "a sqlite3 connection to its file")
            self._check(None, where=store.path)
            return write_sqlite(store, conn, write, own=False)
        if client is not Client.PSYCOPG:
            raise wrong_client(client, "PostgreSQL from blocking code", "a psycopg (3) connection")
        self._check(conn, where="the caller's connection")
        return write_psycopg(store, conn, write, where="the caller's connection")

    def _write_own(self, write: Write) -> Any:
        store = self._store
        if isinstance(store, SqliteStore):
            assert self._sqlite is not None
            # Each new connection's file is checked as it opens (SqliteStore.connect).
            return write_sqlite_own(store, self._sqlite, write)
        assert self._psycopg is not None
        fresh = False
        while True:
            with self._psycopg.connection(fresh=fresh) as (conn, reused):
                self._check(conn, where=store.shown)
                answer = write_psycopg_own(store, conn, write, reused=reused)
            if answer is not STALE:
                return answer
            fresh = True  # the kept connection was closed by the server: a new one

    def _check(self, conn: Any, *, where: str) -> None:
        """Refuse a store that is not migrated, or migrated by a newer release, once."""
        if self._checked:
            return
        store = self._store
        if isinstance(store, SqliteStore):
            store.check()
        else:
            _check_postgres(store, conn, where=where)
        self._checked = True


def _check_postgres(store: PostgresStore, conn: Any, *, where: str) -> None:
    import contextlib

    import psycopg

    with (
        postgres_failures(where=where, schema=store.sql.schema),
        contextlib.closing(psycopg.RawCursor(conn)) as cursor,
    ):
        recorded = run_plan(recorded_plan(store.sql), psycopg_fetch(cursor))
    judge_schema(store.sql, recorded)


def _close(conn: Any) -> None:
    conn.close()
