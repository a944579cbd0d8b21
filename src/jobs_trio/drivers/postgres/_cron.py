# The PostgreSQL driver's cron marks: each task's last tick, advanced once per fleet.
# Apart because a tick's firing is its own write (invariant 11), beside no job's.
from __future__ import annotations

from collections.abc import Sequence

from ..._core.errors import JobsError
from ..._core.records import TaskAdvance, TaskMark
from .._postgres_plan import fetch_on, insert_query
from .._postgres_pool import Connection
from .._rules import FIRE_HISTORY
from ._connection import PostgresConnection


class _FireTaken(JobsError):
    """A fire of this task and scheduled time is already on record: roll the advance back.
    A JobsError so the bridge hands it through as it is."""


class PostgresCron(PostgresConnection):
    """Cron tasks' marks: each tick fired once, whoever advances it."""

    # --- cron tasks ---

    async def task_marks(self) -> Sequence[TaskMark]:
        return [TaskMark(*row) for row in await self._fetch("task_marks", what="task_marks")]

    async def advance_task(self, advance: TaskAdvance) -> bool:
        self._check_open()
        now = self.now()
        sql = self._sql
        jobs = [f.job for f in advance.fires]
        last = advance.fires[-1] if advance.fires else None

        async def move(conn: Connection) -> bool:
            if advance.expected is None:
                moved = await conn.fetchval(
                    sql["task_mark_create"], now, advance.task, advance.advance_to
                )
            else:
                moved = await conn.fetchval(
                    sql["task_mark_move"],
                    now,
                    advance.task,
                    advance.advance_to,
                    None if last is None else last.scheduled,
                    None if last is None else last.job.job_id,
                    advance.expected,
                )
            if moved is None:
                return False
            if not jobs:
                return True
            # Fire jobs carry no key, so every row is written: their ids are the NewJobs'.
            await fetch_on(conn, insert_query(sql, now, jobs))
            recorded = await conn.fetch(
                sql["task_fires_record"],
                now,
                advance.task,
                [f.scheduled for f in advance.fires],
                [j.job_id for j in jobs],
            )
            if len(recorded) != len(jobs):
                raise _FireTaken(f"task {advance.task!r}: a fire time is already on record")
            if advance.expected is None:
                # Created and fired at once: the create left the last-fired columns empty.
                await conn.execute(
                    sql["task_mark_move"],
                    now,
                    advance.task,
                    advance.advance_to,
                    last.scheduled if last else None,
                    last.job.job_id if last else None,
                    advance.advance_to,
                )
            await conn.execute(sql["task_fires_prune"], advance.task, FIRE_HISTORY)
            return True

        try:
            applied: bool = await self.bridge.run(move, what="advance_task", transaction=True)
        except _FireTaken:
            return False
        return applied
