# The SQLite driver's durable steps and events: step records (fenced saves), sends and looks.
# Apart because a job's steps and the events it waits for outlive its attempts.
from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import Final

from ..._core.records import EventLook, JobId, Lease, StepRecord
from .._rows import STEP_FIELDS, event_record, step_record, step_values
from .._rules import event_mark
from .._sqlite_enqueue import store_event
from .._transaction import unwrap
from ._connection import _FENCE, SqliteConnection

# Rows to records (_rows.step_record, _rows.event_record): column names are the record's field
# names, in their order (the job's: _rows.JOB_COLUMNS).
_STEP_COLUMNS: Final = ", ".join(STEP_FIELDS)
_EVENT_COLUMNS: Final = "id, name, key, payload, created_at"


class SqliteStepsAndEvents(SqliteConnection):
    """Durable steps and the events a suspended job waits for."""

    async def save_step(
        self, lease: Lease, step: StepRecord, *, connection: object | None = None
    ) -> bool:
        conn, tx = unwrap(connection)

        def work(conn: sqlite3.Connection, now: float) -> bool:
            cursor = conn.execute(
                f"INSERT INTO steps (job_id, {_STEP_COLUMNS})"
                " SELECT ?, ?, ?, ?, ?, ?, ?, ?, ?"
                f" WHERE EXISTS (SELECT 1 FROM jobs WHERE {_FENCE})"
                " ON CONFLICT (job_id, name) DO UPDATE SET status = excluded.status,"
                " started_at = excluded.started_at, finished_at = excluded.finished_at,"
                " result = excluded.result, wake_at = excluded.wake_at,"
                " event = excluded.event, match = excluded.match",
                (lease.job_id, *step_values(step), lease.job_id, lease.token),
            )
            return cursor.rowcount == 1

        if conn is not None:
            # In the caller's transaction (step.transaction): it holds the file's write lock
            # from its BEGIN IMMEDIATE to its end, so no claim of another process can change
            # the token between this check and the commit that lands the step's effects.
            return await self._on_callers(conn, tx, work, wake=False)
        return await self._transact(work)

    async def load_steps(self, job_id: JobId) -> Sequence[StepRecord]:
        def work(conn: sqlite3.Connection, now: float) -> list[StepRecord]:
            # rowid order: the order steps were first saved (an upsert keeps the row's rowid).
            rows = conn.execute(
                f"SELECT {_STEP_COLUMNS} FROM steps WHERE job_id = ? ORDER BY rowid", (job_id,)
            )
            return [step_record(row) for row in rows]

        return await self._transact(work, mode="read")

    # Events.

    async def send_event(
        self, name: str, payload: str, *, key: str | None = None, connection: object | None = None
    ) -> str:
        json.loads(payload)  # the boundary checked it; a driver never stores what it cannot read
        conn, tx = unwrap(connection)

        def work(conn: sqlite3.Connection, now: float) -> str:
            return store_event(conn, name, payload, key, now)

        if conn is not None:
            # In the caller's transaction, as an enqueue is: the order row, its job and the
            # event a waiting workflow needs land together, and the wake-up waits for the commit.
            return await self._on_callers(conn, tx, work, wake=True)
        event_id = await self._transact(work)
        self._wake()
        return event_id

    async def look_for_event(self, name: str, *, key: str | None, since: float | None) -> EventLook:
        where, values = ["name = ?"], list[object]([name])
        if key is not None:
            where.append("key = ?")
            values.append(key)
        if since is not None:
            where.append("created_at >= ?")
            values.append(since)

        def work(conn: sqlite3.Connection, now: float) -> EventLook:
            # One read transaction, one snapshot: the mark covers every event the look read.
            (newest,) = conn.execute(
                "SELECT max(id) FROM events WHERE name = ?", (name,)
            ).fetchone()
            row = conn.execute(
                f"SELECT {_EVENT_COLUMNS} FROM events WHERE {' AND '.join(where)}"
                " ORDER BY id LIMIT 1",
                values,
            ).fetchone()
            return EventLook(None if row is None else event_record(row), event_mark(newest))

        return await self._transact(work, mode="read")
