# The SQLite driver's cron marks: each task's last tick, advanced once per fleet.
# Apart because a tick's firing is its own write (invariant 11), beside no job's.
from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from ..._core.records import TaskAdvance, TaskMark
from .._rules import FIRE_HISTORY
from .._sqlite_enqueue import insert_jobs
from ._connection import SqliteConnection


class _FireTaken(Exception):
    """A fire of this task and scheduled time is already on record: roll the advance back."""


class SqliteCron(SqliteConnection):
    """Cron tasks' marks: each tick fired once, whoever advances it."""

    # Cron tasks.

    async def task_marks(self) -> Sequence[TaskMark]:
        def work(conn: sqlite3.Connection, now: float) -> list[TaskMark]:
            rows = conn.execute(
                "SELECT task, handled_until, last_fired, last_fired_at, last_job_id"
                " FROM task_marks ORDER BY task"
            )
            return [TaskMark(*row) for row in rows]

        return await self._transact(work, mode="read")

    async def advance_task(self, advance: TaskAdvance) -> bool:
        def work(conn: sqlite3.Connection, now: float) -> bool:
            # BEGIN IMMEDIATE holds the file's write lock from the read on: no other process
            # can move the mark between this compare and the set below.
            row = conn.execute(
                "SELECT handled_until FROM task_marks WHERE task = ?", (advance.task,)
            ).fetchone()
            if (None if row is None else row[0]) != advance.expected:
                return False
            answers = insert_jobs(conn, [f.job for f in advance.fires], now)
            for fire, answer in zip(advance.fires, answers, strict=True):
                taken = conn.execute(
                    "INSERT INTO task_fires (task, scheduled, job_id, fired_at)"
                    " VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
                    (advance.task, fire.scheduled, answer.job_id, now),
                )
                if taken.rowcount != 1:
                    raise _FireTaken  # rolls back the jobs inserted above
            conn.execute(
                "DELETE FROM task_fires WHERE task = ? AND scheduled < (SELECT scheduled"
                " FROM task_fires WHERE task = ? ORDER BY scheduled DESC LIMIT 1 OFFSET ?)",
                (advance.task, advance.task, FIRE_HISTORY - 1),
            )
            last = (advance.fires[-1].scheduled, now, answers[-1].job_id) if answers else None
            conn.execute(
                "INSERT INTO task_marks (task, handled_until, last_fired, last_fired_at,"
                " last_job_id, updated_at) VALUES (?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (task) DO UPDATE SET handled_until = excluded.handled_until,"
                " last_fired = coalesce(excluded.last_fired, last_fired),"
                " last_fired_at = coalesce(excluded.last_fired_at, last_fired_at),"
                " last_job_id = coalesce(excluded.last_job_id, last_job_id),"
                " updated_at = excluded.updated_at",
                (advance.task, advance.advance_to, *(last or (None, None, None)), now),
            )
            return True

        try:
            applied = await self._transact(work)
        except _FireTaken:
            return False
        self._wake()
        return applied
