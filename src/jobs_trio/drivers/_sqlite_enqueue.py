# The SQLite enqueue and event send as plain blocking functions of a sqlite3 connection, and the
# way they join a caller's transaction: the driver runs them in its worker threads, the
# producers (jobs_trio.sync, jobs_trio.aio) on the application's connection. Apart so that what
# a job's row is, and how a caller's transaction is joined, is said once for SQLite.
from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

import attrs

from .._core.errors import ConfigError, ValueRefused
from .._core.records import Enqueued, JobId, JobLimits, NewJob
from ._rules import LIVE_STATES_SQL
from ._sqlite_door import REFUSED, file_error

T = TypeVar("T")

_SAVEPOINT = "jobs_trio_write"


def _limit_columns(limits: JobLimits | None) -> tuple[object, ...]:
    """slot_key, slots, rate_key, starts, per: all NULL for a job without limits."""
    if limits is None:
        return (None,) * 5
    return attrs.astuple(limits)


def _window_holder(conn: sqlite3.Connection, job: NewJob, now: float) -> JobId | None:
    """The newest job holding ``job``'s key by its window (rules.in_window), if any. Under the
    file's write lock (BEGIN IMMEDIATE), so no other writer's job can appear before the insert."""
    assert job.unique_for is not None
    covered = ", ".join("?" * len(job.unique_states)) or "NULL"
    row = conn.execute(
        "SELECT id FROM jobs INDEXED BY jobs_key_created WHERE key = ? AND created_at > ?"
        f" AND (state IN {LIVE_STATES_SQL} OR state IN ({covered}))"
        " ORDER BY created_at DESC, id DESC LIMIT 1",
        (job.key, now - job.unique_for, *job.unique_states),
    ).fetchone()
    return None if row is None else JobId(row[0])


def insert_jobs(conn: sqlite3.Connection, jobs: Sequence[NewJob], now: float) -> list[Enqueued]:
    """Write ``jobs`` (enqueue's rows); answer each one's id, or its key holder's."""
    if any(job.unique_for is not None for job in jobs):
        # A key with a window: each job in turn, its window looked at before its insert (a job
        # earlier in the batch may be the one that holds it).
        answers: list[Enqueued] = []
        for job in jobs:
            holder = None if job.unique_for is None else _window_holder(conn, job, now)
            if holder is not None:
                answers.append(Enqueued(holder, created=False))
            else:
                answers += _insert_batch(conn, [job], now)
        return answers
    return _insert_batch(conn, jobs, now)


def _insert_batch(conn: sqlite3.Connection, jobs: Sequence[NewJob], now: float) -> list[Enqueued]:
    # A job whose key a live job holds is skipped by the partial unique index; who
    # holds each key is read back afterwards (also when the holder came earlier in
    # this same batch).
    conn.executemany(
        "INSERT INTO jobs (id, name, queue, state, payload, priority, attempts,"
        " max_attempts, run_at, created_at, updated_at, key, slot_key, slots, rate_key, starts,"
        " per, context) VALUES (?, ?, ?, 'ready', ?, ?, 0, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
        f" ON CONFLICT (key) WHERE key IS NOT NULL AND state IN {LIVE_STATES_SQL} DO NOTHING",
        [
            (
                job.job_id,
                job.name,
                job.queue,
                job.payload,
                job.priority,
                job.max_attempts,
                now + max(job.delay, 0.0),
                now,
                now,
                job.key,
                *_limit_columns(job.limits),
                job.context,
            )
            for job in jobs
        ],
    )
    holders: dict[str, JobId] = {}
    for key in {job.key for job in jobs if job.key is not None}:
        row = conn.execute(
            f"SELECT id FROM jobs WHERE key = ? AND state IN {LIVE_STATES_SQL}", (key,)
        ).fetchone()
        holders[key] = row[0]
    return [
        Enqueued(job.job_id, created=True)
        if job.key is None
        else Enqueued(holders[job.key], created=holders[job.key] == job.job_id)
        for job in jobs
    ]


def store_event(
    conn: sqlite3.Connection, name: str, payload: str, key: str | None, now: float
) -> str:
    """Store an event and make every job suspended on it ready now; answer its id."""
    cursor = conn.execute(
        "INSERT INTO events (name, key, payload, created_at) VALUES (?, ?, ?, ?)",
        (name, key, payload, now),
    )
    conn.execute(
        "UPDATE jobs SET state = 'ready', run_at = ?, updated_at = ?"
        " WHERE state = 'suspended' AND wait_event = ?"
        " AND (wait_key IS NULL OR wait_key = ?)",  # rules.send_wakes
        (now, now, name, key),
    )
    return str(cursor.lastrowid)


def refuse_another_file(connection: sqlite3.Connection, path: str) -> None:
    """A write on a connection to another file would commit with THAT file's transaction and
    never reach the workers of ``path``: the dual-write bug, silently. Refused."""
    row = connection.execute("PRAGMA database_list").fetchone()
    there = row[2] if row else ""
    try:
        same = bool(there) and os.path.samefile(there, path)
    except OSError:
        same = False
    if not same:
        raise ConfigError(
            f"the sqlite3 connection is to {there or 'an in-memory database'!r}, not to"
            f" the driver's file {path!r}",
            fix="enqueue through a connection to the driver's own file; for another"
            " database, write to its outbox and run a relay (docs/transactions.md)",
        )


def joins_callers(connection: sqlite3.Connection) -> bool:
    """Whether a write on ``connection`` belongs to a transaction its caller commits: one it is
    in, or one the DB-API opens before any write (sqlite3's default ``isolation_level``, or
    ``autocommit=False``): as the caller's own INSERT would, the job waits for their commit.
    Only a connection in autocommit mode (``isolation_level=None``) outside a transaction
    gets one of its own."""
    if connection.in_transaction:
        return True
    autocommit = getattr(connection, "autocommit", None)  # Python 3.12+: True, False or legacy
    if isinstance(autocommit, bool):
        return not autocommit
    return connection.isolation_level is not None


def write_in(
    connection: sqlite3.Connection,
    work: Callable[[sqlite3.Connection], T],
    *,
    leave_open: bool = False,
    cancelled: threading.Event | None = None,
) -> T:
    """Run ``work`` on ``connection``: in the caller's transaction when it has one
    (``joins_callers``), inside a savepoint so that a failure here undoes only these writes and
    the transaction goes on; else in one of its own, committed here. A transaction begun here
    is BEGIN IMMEDIATE: the write lock first, so the writes never fail half-way on a lock
    upgrade. ``leave_open``: a savepoint whose work succeeded is left for the caller to end
    (``end_savepoint``), who decides once it knows whether its await was cancelled.
    ``cancelled``: set by a caller whose await was cancelled; a transaction of this write's own
    is rolled back rather than committed once it is (``WriteCancelled``)."""
    if not joins_callers(connection):
        connection.execute("BEGIN IMMEDIATE")
        # COMMIT and ROLLBACK as statements, not the DB-API's commit()/rollback(): on a
        # connection opened with autocommit=True (Python 3.12+) those do nothing, and the job
        # would stay uncommitted, the file's write lock held, until the connection closed.
        try:
            answer = work(connection)
            if cancelled is not None and cancelled.is_set():
                raise WriteCancelled
        except BaseException:
            if connection.in_transaction:  # SQLite rolls back by itself on a few errors
                connection.execute("ROLLBACK")
            raise
        connection.execute("COMMIT")
        return answer
    if not connection.in_transaction:
        # The transaction the DB-API would open before this write; the caller commits it.
        connection.execute("BEGIN IMMEDIATE")
    connection.execute(f"SAVEPOINT {_SAVEPOINT}")
    try:
        answer = work(connection)
    except BaseException:
        end_savepoint(connection, keep=False)
        raise
    if not leave_open:
        end_savepoint(connection, keep=True)
    return answer


class WriteCancelled(Exception):
    """The caller's await was cancelled before the write's own transaction committed: it was
    rolled back instead."""


def end_savepoint(connection: sqlite3.Connection, *, keep: bool) -> None:
    """End the write's savepoint in the caller's transaction: its rows kept (released into the
    transaction) or undone. Never waits for the file: the caller's transaction holds its lock."""
    if not connection.in_transaction:
        return  # SQLite rolled the whole transaction back by itself: nothing is left to end
    if not keep:
        connection.execute(f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}")
    connection.execute(f"RELEASE SAVEPOINT {_SAVEPOINT}")


def caller_error(path: str, exc: Exception) -> Exception | None:
    """The error a caller sees for ``exc``, raised by a write on an application's connection to
    ``path`` (None: not SQLite's, let it through)."""
    if isinstance(exc, REFUSED):
        return ValueRefused(
            f"SQLite refused a write in the caller's transaction on {path!r}:"
            f" {type(exc).__name__}: {exc}",
            fix="the value cannot be stored as it is; only this write was undone (a"
            " savepoint), the rest of the transaction is intact",
        )
    if isinstance(exc, sqlite3.ProgrammingError):
        return ConfigError(
            f"cannot write through the caller's sqlite3 connection: {exc}",
            fix="open it with sqlite3.connect(path, check_same_thread=False) when jobs_trio"
            " runs its statements in worker threads (a Trio or asyncio application)",
        )
    if isinstance(exc, sqlite3.Error):
        return file_error(path, exc)
    return None
