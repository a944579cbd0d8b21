# The SQLite driver's admin side: reads (get, list, stats, history), operator transitions, pruning.
# Apart because nothing on a worker's path calls it, only the CLI, dashboard and pruner.
from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence

from ..._core.operator_transitions import (
    OPERATOR_CANCEL_ERROR,
    cancel_flags_only,
    check_delete,
    check_retry,
    check_run_now,
    found,
    key_held,
)
from ..._core.records import (
    AttemptRecord,
    JobId,
    JobRecord,
    NameStats,
    OutcomeCount,
    Pruned,
    PruneTurn,
    QueueStats,
)
from .._calls import JobFilter, ListCalls
from .._fleet_stats import decode as decode_fleet_stats
from .._fleet_stats import encode as encode_fleet_stats
from .._retention import DEAD_STATE, FINISHED_STATES, cutoffs, turn_is_free
from .._rows import JOB_COLUMNS, job_record
from .._rules import LIVE_STATES_SQL, WAITING_STATES_SQL, name_stats, queue_stats
from ._connection import _ATTEMPT_COLUMNS, SqliteConnection, _paused


def _job_or_raise(conn: sqlite3.Connection, job_id: JobId) -> JobRecord:
    row = conn.execute(f"SELECT {JOB_COLUMNS} FROM jobs WHERE id = ?", (job_id,)).fetchone()
    return job_record(found(row, job_id))


def _queue_stats(conn: sqlite3.Connection, now: float) -> list[QueueStats]:
    return queue_stats(
        conn.execute("SELECT queue, state, count(*) FROM jobs GROUP BY queue, state"),
        conn.execute(
            "SELECT queue, count(*), min(run_at) FROM jobs"
            " WHERE state = 'ready' AND run_at <= ? GROUP BY queue",
            (now,),
        ),
        now,
        conn.execute(
            "SELECT queue, name, substr(waiting_on, 1, 4), count(*) FROM jobs"
            f" WHERE waiting_on IS NOT NULL AND state IN {WAITING_STATES_SQL}"
            " GROUP BY queue, name, substr(waiting_on, 1, 4)"
        ),
        _paused(conn),
    )


class SqliteAdmin(ListCalls, SqliteConnection):
    """What operators read and do: jobs, stats, history, retention."""

    # Reads and operator actions.

    async def get(self, job_id: JobId) -> JobRecord | None:
        def work(conn: sqlite3.Connection, now: float) -> JobRecord | None:
            row = conn.execute(f"SELECT {JOB_COLUMNS} FROM jobs WHERE id = ?", (job_id,))
            found = row.fetchone()
            return None if found is None else job_record(found)

        return await self._transact(work, mode="read")

    async def _list_jobs(self, wanted: JobFilter) -> Sequence[JobRecord]:
        state, queue, name, changed_before, limit = wanted.parts()
        where, values = ["1"], list[object]()
        for column, value in (("state", state), ("queue", queue), ("name", name)):
            if value is not None:
                where.append(f"{column} = ?")
                values.append(str(value))
        if changed_before is not None:
            where.append("updated_at < ?")
            values.append(float(changed_before))

        def work(conn: sqlite3.Connection, now: float) -> list[JobRecord]:
            rows = conn.execute(
                f"SELECT {JOB_COLUMNS} FROM jobs WHERE {' AND '.join(where)}"
                " ORDER BY created_at DESC, id DESC LIMIT ?",
                (*values, max(limit, 0)),
            )
            return [job_record(row) for row in rows]

        return await self._transact(work, mode="read")

    async def retry(self, job_id: JobId) -> JobRecord:
        def work(conn: sqlite3.Connection, now: float) -> JobRecord:
            record = _job_or_raise(conn, job_id)
            check_retry(record)
            if (
                record.key is not None
                and conn.execute(
                    f"SELECT 1 FROM jobs WHERE key = ? AND state IN {LIVE_STATES_SQL} AND id != ?",
                    (record.key, job_id),
                ).fetchone()
            ):
                raise key_held(job_id, record.key)
            conn.execute(
                "UPDATE jobs SET state = 'ready', run_at = ?, attempts = 0, ahead_lapses = 0,"
                " orphans = 0,"
                " cancel_requested = 0, waiting_on = NULL, updated_at = ? WHERE id = ?",
                (now, now, job_id),
            )
            return _job_or_raise(conn, job_id)

        record = await self._transact(work)
        self._wake()
        return record

    async def cancel(self, job_id: JobId) -> JobRecord:
        def work(conn: sqlite3.Connection, now: float) -> JobRecord:
            record = _job_or_raise(conn, job_id)
            values: tuple[object, ...]
            if cancel_flags_only(record):
                # Its worker hears it at the next renewal and cancels the run.
                changes, values = "cancel_requested = 1", ()
            else:
                changes, values = "state = 'cancelled', last_error = ?", (OPERATOR_CANCEL_ERROR,)
            conn.execute(
                f"UPDATE jobs SET {changes}, updated_at = ? WHERE id = ?", (*values, now, job_id)
            )
            return _job_or_raise(conn, job_id)

        return await self._transact(work)

    async def delete(self, job_id: JobId) -> JobRecord:
        def work(conn: sqlite3.Connection, now: float) -> JobRecord:
            record = _job_or_raise(conn, job_id)
            check_delete(record)
            for table, column in (("steps", "job_id"), ("attempts", "job_id"), ("jobs", "id")):
                conn.execute(f"DELETE FROM {table} WHERE {column} = ?", (job_id,))
            return record

        return await self._transact(work)

    async def run_now(self, job_id: JobId) -> JobRecord:
        def work(conn: sqlite3.Connection, now: float) -> JobRecord:
            record = _job_or_raise(conn, job_id)
            check_run_now(record)
            if record.run_at <= now:
                return record
            conn.execute(
                "UPDATE jobs SET run_at = ?, updated_at = ? WHERE id = ?", (now, now, job_id)
            )
            return _job_or_raise(conn, job_id)

        record = await self._transact(work)
        self._wake()
        return record

    async def stats(self) -> Sequence[QueueStats]:
        return await self._transact(_queue_stats, mode="read")

    async def fleet_stats(self, worker_id: str, interval: float) -> Sequence[QueueStats]:
        def work(conn: sqlite3.Connection, now: float) -> list[QueueStats]:
            # The compare-and-set of the turn, under BEGIN IMMEDIATE: one process takes it.
            turn = conn.execute(
                "UPDATE fleet_stats SET taken_at = ?, worker_id = ?"
                " WHERE id = 1 AND (taken_at IS NULL OR taken_at <= ?) RETURNING id",
                (now, worker_id, now - interval),
            ).fetchone()
            if turn is None:
                (observed,) = conn.execute(
                    "SELECT observed FROM fleet_stats WHERE id = 1"
                ).fetchone()
                return decode_fleet_stats(observed)
            stats = _queue_stats(conn, now)
            conn.execute(
                "UPDATE fleet_stats SET observed = ? WHERE id = 1", (encode_fleet_stats(stats),)
            )
            return stats

        return await self._transact(work)

    async def prune(self, turn: PruneTurn) -> Pruned:
        def work(conn: sqlite3.Connection, now: float) -> Pruned:
            # The turn's compare-and-set and the batch in one BEGIN IMMEDIATE: two pruners
            # never delete at once, and a turn whose holder died frees itself after its hold.
            holder, held_until, ended_at = conn.execute(
                "SELECT holder, held_until, ended_at FROM prune_turn WHERE id = 1"
            ).fetchone()
            if not turn_is_free(turn, holder, held_until, ended_at, now):
                return Pruned(turn=False)
            finished_before, dead_before = cutoffs(turn, now)
            ages = [(state, finished_before) for state in FINISHED_STATES]
            if dead_before is not None:
                ages.append((DEAD_STATE, dead_before))
            doomed: list[str] = []
            for state, before in ages:
                # One state at a time, so each reads its own partial index (0007), oldest
                # first, and stops at the batch's limit.
                doomed += [
                    row[0]
                    for row in conn.execute(
                        f"SELECT id FROM jobs WHERE state = '{state.value}' AND updated_at < ?"
                        " ORDER BY updated_at LIMIT ?",
                        (before, turn.limit - len(doomed)),
                    )
                ]
                if len(doomed) >= turn.limit:
                    break
            # The ids as one JSON array: a batch of any size is one bound value.
            ids = json.dumps(doomed)
            for table, column in (("steps", "job_id"), ("attempts", "job_id"), ("jobs", "id")):
                conn.execute(
                    f"DELETE FROM {table} WHERE {column} IN (SELECT value FROM json_each(?))",
                    (ids,),
                )
            more = len(doomed) >= turn.limit
            if more:
                conn.execute(
                    "UPDATE prune_turn SET holder = ?, held_until = ? WHERE id = 1",
                    (turn.holder, now + turn.hold),
                )
            else:
                conn.execute(
                    "UPDATE prune_turn SET holder = NULL, held_until = NULL, ended_at = ?"
                    " WHERE id = 1",
                    (now,),
                )
            return Pruned(turn=True, deleted=len(doomed), more=more)

        return await self._transact(work)

    # Attempt history and worker presence (what the dashboard shows).

    async def load_attempts(self, job_id: JobId) -> Sequence[AttemptRecord]:
        def work(conn: sqlite3.Connection, now: float) -> list[AttemptRecord]:
            rows = conn.execute(
                f"SELECT {_ATTEMPT_COLUMNS} FROM attempts WHERE job_id = ? ORDER BY seq",
                (job_id,),
            )
            return [AttemptRecord(*row) for row in rows]

        return await self._transact(work, mode="read")

    async def outcome_counts(self, since: float, bucket: float) -> Sequence[OutcomeCount]:
        def work(conn: sqlite3.Connection, now: float) -> list[OutcomeCount]:
            rows = conn.execute(
                # CAST truncates, which is floor for the positive times of a clock; floor()
                # itself is missing from SQLite builds without the math functions.
                "SELECT CAST(ended_at / ? AS INTEGER) * ? AS start, outcome, count(*)"
                " FROM attempts WHERE ended_at >= ? GROUP BY start, outcome"
                " ORDER BY start, outcome",
                (bucket, bucket, since),
            )
            return [OutcomeCount(*row) for row in rows]

        return await self._transact(work, mode="read")

    async def name_stats(self, since: float) -> Sequence[NameStats]:
        def work(conn: sqlite3.Connection, now: float) -> list[NameStats]:
            rows = conn.execute(
                "SELECT j.name, a.outcome, count(*), count(a.seconds), sum(a.seconds),"
                " max(a.seconds) FROM attempts AS a JOIN jobs AS j ON j.id = a.job_id"
                " WHERE a.ended_at >= ? GROUP BY j.name, a.outcome",
                (since,),
            )
            return name_stats(rows)

        return await self._transact(work, mode="read")
