# A producer's write as blocking calls: on a sqlite3 connection (the SQLite writes themselves)
# and on a psycopg connection (the PostgreSQL plan, its `$n` statements sent by psycopg's raw
# cursor as written), in the caller's transaction or in one of their own. Apart from the
# asyncio side (awaiting.py), which runs the same writes through asyncio's clients.
from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from typing import Any

from .._core.errors import JobsError
from ..drivers._postgres_plan import Query, Rows, run_plan
from ..drivers._sqlite_door import moved_away
from ..drivers._sqlite_enqueue import caller_error, refuse_another_file, write_in
from .callers import Client, joins_callers
from .failures import postgres_failure, postgres_failures
from .keeper import Keeper
from .stores import PostgresStore, SqliteStore
from .writes import Write

_SAVEPOINT = "jobs_trio_write"


def write_sqlite(
    store: SqliteStore,
    conn: sqlite3.Connection,
    write: Write,
    *,
    own: bool,
    leave_open: bool = False,
    cancelled: threading.Event | None = None,
) -> Any:
    """``write`` on ``conn``: the producer's own (autocommit: a transaction of its own) or the
    application's (checked to be on the store's file; its transaction joined, or not: see
    callers.joins_callers). ``leave_open`` and ``cancelled``: as ``write_in``'s."""
    now = time.time()
    try:
        if not own:
            refuse_another_file(conn, store.path)
        return write_in(
            conn, lambda c: write.on_sqlite(c, now), leave_open=leave_open, cancelled=cancelled
        )
    except JobsError:
        raise
    except Exception as exc:
        mapped = caller_error(store.path, exc)
        if mapped is None:
            raise
        raise mapped from exc


def write_sqlite_own(
    store: SqliteStore,
    keeper: Keeper[sqlite3.Connection],
    write: Write,
    cancelled: threading.Event | None = None,
) -> Any:
    """``write`` on a connection of the producer's own (``cancelled``: as ``write_in``'s). A
    kept connection whose file was replaced or deleted since it opened is closed and a new one
    opened on the file at the path now, checked again: written through, its jobs went to the
    unlinked file and were lost, each with its id answered. (A new connection's file is
    checked as it opens: SqliteStore.connect.)"""
    for fresh in (False, True):
        try:
            with keeper.connection(fresh=fresh) as (conn, reused):
                if reused and moved_away(conn) is not None:
                    raise _Moved  # the keeper closes it
                return write_sqlite(store, conn, write, own=True, cancelled=cancelled)
        except _Moved:
            pass
    raise AssertionError("a fresh connection is never one that moved")


class _Moved(Exception):
    """A kept connection's file is not the one at its path any more."""


def psycopg_fetch(cursor: Any) -> Any:
    """A plan's fetch on a psycopg raw cursor (``$n`` placeholders, as the driver's SQL)."""

    def fetch(query: Query) -> Rows:
        cursor.execute(query.sql, query.args)
        return list(cursor.fetchall()) if cursor.description is not None else []

    return fetch


def write_psycopg(store: PostgresStore, conn: Any, write: Write, *, where: str) -> Any:
    """``write`` on a psycopg connection of the application's: inside its transaction (a
    savepoint of it) or one of its own, as callers.joins_callers decides."""
    import psycopg

    now = time.time()
    with (
        postgres_failures(where=where, schema=store.sql.schema),
        contextlib.closing(psycopg.RawCursor(conn)) as cursor,
    ):
        fetch = psycopg_fetch(cursor)
        if not joins_callers(Client.PSYCOPG, conn):
            with conn.transaction():
                return run_plan(write.plan(store.sql, now), fetch)
        fetch(Query(f"SAVEPOINT {_SAVEPOINT}", ()))
        try:
            answer = run_plan(write.plan(store.sql, now), fetch)
        except BaseException:
            # Only this write undone; the caller's transaction goes on (a broken
            # connection has nothing left to undo: the original error is the one to see).
            with contextlib.suppress(psycopg.Error):
                fetch(Query(f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}", ()))
                fetch(Query(f"RELEASE SAVEPOINT {_SAVEPOINT}", ()))
            raise
        fetch(Query(f"RELEASE SAVEPOINT {_SAVEPOINT}", ()))
        return answer


def write_psycopg_own(store: PostgresStore, conn: Any, write: Write, *, reused: bool) -> Any:
    """``write`` in a transaction of its own on the producer's own connection (autocommit).
    Answers ``Stale`` when a connection kept from an earlier call fails at its BEGIN: the
    server closed it while it sat idle, nothing was sent, and a new one may try again."""
    import psycopg

    now = time.time()
    with (
        postgres_failures(where=store.shown, schema=store.sql.schema),
        contextlib.closing(psycopg.RawCursor(conn)) as cursor,
    ):
        fetch = psycopg_fetch(cursor)
        try:
            fetch(Query("BEGIN", ()))
        except psycopg.OperationalError:
            if reused:
                return STALE
            raise
        try:
            answer = run_plan(write.plan(store.sql, now), fetch)
        except BaseException:
            with contextlib.suppress(psycopg.Error):
                fetch(Query("ROLLBACK", ()))
            raise
        fetch(Query("COMMIT", ()))
        return answer


class _Stale:
    """write_psycopg_own's answer for a kept connection found closed: try a new one."""


STALE = _Stale()


def connect_psycopg(store: PostgresStore) -> Any:
    """A producer's own psycopg connection, in autocommit mode (each write begins and commits
    its own transaction), with the driver's timeouts."""
    import psycopg

    try:
        conn = psycopg.connect(autocommit=True, **store.psycopg_options())
        sets = store.session_sets()
        if sets is not None:
            conn.execute(sets)
    except psycopg.Error as exc:
        mapped = postgres_failure(exc, where=store.shown, schema=store.sql.schema)
        raise (mapped or exc) from exc
    return conn
