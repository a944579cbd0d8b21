# The PostgreSQL driver's admin side: reads (get, list, stats, history), operator actions, prune.
# Apart because nothing on a worker's path calls it, only the CLI, dashboard and pruner.
from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

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
    JobState,
    NameStats,
    OutcomeCount,
    Pruned,
    PruneTurn,
    QueueStats,
)
from .._calls import JobFilter, ListCalls
from .._fleet_stats import decode as decode_fleet_stats
from .._fleet_stats import encode as encode_fleet_stats
from .._postgres_pool import Connection
from .._postgres_sql import Statements
from .._retention import cutoffs, turn_is_free
from .._rows import job_record
from .._rules import name_stats, queue_stats
from ._connection import PostgresConnection

T = TypeVar("T")


async def _read_stats(conn: Connection, sql: Statements, now: float) -> list[QueueStats]:
    """The queues' figures, read inside the caller's transaction: the bridge's (``transaction=
    True``), whose rollback after a cancel is bounded. One of asyncpg's own here rolled back
    unbounded: a drain cut the read on a server that had stopped answering, and the worker
    process never ended (10 minutes after SIGTERM, grace 3 s)."""
    # A count of every row reads the table through, and the pool turns sequential scans off
    # (postgres_pool.PLANNER_SETTINGS): back on for this transaction only, or the count would
    # walk an index and fetch every row from it (slower on a large table).
    await conn.execute("SET LOCAL enable_seqscan = on")
    # The stats rows are one per queue and state; only a queue's ready row has jobs due.
    rows = await conn.fetch(sql["stats"], now)
    waiting = await conn.fetch(sql["limit_waiting"])
    paused = await conn.fetch(sql["paused_queues"])
    return queue_stats(
        ((row["queue"], row["state"], row["n"]) for row in rows),
        ((row["queue"], row["due"], row["oldest_due"]) for row in rows if row["due"]),
        now,
        ((row["queue"], row["name"], row["kind"], row["n"]) for row in waiting),
        (row["queue"] for row in paused),
    )


def _record_or_raise(row: Any, job_id: JobId) -> JobRecord:
    return job_record(found(row, job_id))


class PostgresAdmin(ListCalls, PostgresConnection):
    """What operators read and do: jobs, stats, history, retention."""

    # --- operators ---

    async def get(self, job_id: JobId) -> JobRecord | None:
        row = await self._fetchrow("get_job", job_id, what="get")
        return None if row is None else job_record(row)

    async def _list_jobs(self, wanted: JobFilter) -> Sequence[JobRecord]:
        state, queue, name, changed_before, limit = wanted.parts()
        self._check_open()
        sql = self._sql
        state_value = None if state is None else JobState(state).value
        before = None if changed_before is None else float(changed_before)

        async def read(conn: Connection) -> list[Any]:
            return list(
                await conn.fetch(sql["list_jobs"], state_value, queue, max(limit, 0), name, before)
            )

        return [job_record(row) for row in await self.bridge.run(read, what="list")]

    async def _on_locked(
        self, job_id: JobId, act: Callable[[Connection, JobRecord], Awaitable[T]], *, what: str
    ) -> T:
        """``act`` on the job ``job_id`` as it is, locked (lock_job) until the transaction they
        share ends: an operator's transition, decided on a record no worker can change
        meanwhile. JobNotFound when there is no such job."""
        self._check_open()
        sql = self._sql

        async def locked(conn: Connection) -> T:
            record = _record_or_raise(await conn.fetchrow(sql["lock_job"], job_id), job_id)
            return await act(conn, record)

        done: T = await self.bridge.run(locked, what=what, transaction=True)
        return done

    async def retry(self, job_id: JobId) -> JobRecord:
        now = self.now()
        sql = self._sql

        async def rerun(conn: Connection, record: JobRecord) -> Any:
            check_retry(record)
            if record.key is not None and await conn.fetchval(
                sql["key_held_elsewhere"], record.key, job_id
            ):
                raise key_held(job_id, record.key)
            try:
                row = await conn.fetchrow(sql["retry_job"], now, job_id)
            except Exception as exc:
                # The index caught a key taken after our look: same answer as the look.
                if getattr(exc, "sqlstate", None) == "23505":
                    raise key_held(job_id, record.key) from exc
                raise
            await conn.execute(sql["notify"], sql.channel, [record.queue])
            return row

        return job_record(await self._on_locked(job_id, rerun, what="retry"))

    async def cancel(self, job_id: JobId) -> JobRecord:
        now = self.now()
        sql = self._sql

        async def stop(conn: Connection, record: JobRecord) -> Any:
            if cancel_flags_only(record):
                return await conn.fetchrow(sql["request_cancel"], now, job_id)
            return await conn.fetchrow(sql["cancel_job"], now, job_id, OPERATOR_CANCEL_ERROR)

        return job_record(await self._on_locked(job_id, stop, what="cancel"))

    async def delete(self, job_id: JobId) -> JobRecord:
        sql = self._sql

        async def remove(conn: Connection, record: JobRecord) -> JobRecord:
            check_delete(record)
            await conn.execute(sql["delete_job"], job_id)
            return record

        return await self._on_locked(job_id, remove, what="delete")

    async def run_now(self, job_id: JobId) -> JobRecord:
        now = self.now()
        sql = self._sql

        async def hurry(conn: Connection, record: JobRecord) -> JobRecord:
            check_run_now(record)
            if record.run_at <= now:
                return record
            updated = job_record(await conn.fetchrow(sql["run_now"], now, job_id))
            await conn.execute(sql["notify"], sql.channel, [record.queue])
            return updated

        return await self._on_locked(job_id, hurry, what="run now")

    async def stats(self) -> Sequence[QueueStats]:
        self._check_open()
        now = self.now()
        sql = self._sql

        async def read(conn: Connection) -> list[QueueStats]:
            return await _read_stats(conn, sql, now)

        stats: list[QueueStats] = await self.bridge.run(read, what="stats", transaction=True)
        return stats

    async def fleet_stats(self, worker_id: str, interval: float) -> Sequence[QueueStats]:
        self._check_open()
        now = self.now()
        sql = self._sql

        async def take_turn(conn: Connection) -> Any:
            return await conn.fetchrow(sql["fleet_stats_turn"], now, worker_id, float(interval))

        turn = await self.bridge.run(take_turn, what="fleet_stats")
        if not turn["mine"]:
            return decode_fleet_stats(turn["observed"])

        async def observe(conn: Connection) -> list[QueueStats]:
            stats = await _read_stats(conn, sql, now)
            await conn.execute(sql["fleet_stats_store"], encode_fleet_stats(stats))
            return stats

        # Not one transaction with the turn: the scan must not hold the row's lock, and a
        # worker that dies here leaves the last observation, replaced an interval later.
        observed: list[QueueStats] = await self.bridge.run(
            observe, what="fleet_stats", transaction=True
        )
        return observed

    async def prune(self, turn: PruneTurn) -> Pruned:
        self._check_open()
        now = self.now()
        sql = self._sql
        finished_before, dead_before = cutoffs(turn, now)

        async def batch(conn: Connection) -> Pruned:
            row = await conn.fetchrow(sql["prune_turn_read"])
            if row is None or not turn_is_free(
                turn, row["holder"], row["held_until"], row["ended_at"], now
            ):
                return Pruned(turn=False)
            gone = [
                row["id"]
                for row in await conn.fetch(
                    sql["prune_batch"], finished_before, dead_before, turn.limit
                )
            ]
            if gone:
                await conn.execute(sql["prune_history"], gone)
            deleted = len(gone)
            more = deleted >= turn.limit
            if more:
                await conn.execute(sql["prune_turn_hold"], turn.holder, now + turn.hold)
            else:
                await conn.execute(sql["prune_turn_end"], now)
            return Pruned(turn=True, deleted=deleted, more=more)

        pruned: Pruned = await self.bridge.run(batch, what="prune", transaction=True)
        return pruned

    # --- attempt history and worker presence (what the dashboard shows) ---

    async def load_attempts(self, job_id: JobId) -> Sequence[AttemptRecord]:
        rows = await self._fetch("load_attempts", job_id, what="load_attempts")
        return [AttemptRecord(**dict(row)) for row in rows]

    async def outcome_counts(self, since: float, bucket: float) -> Sequence[OutcomeCount]:
        self._check_open()
        sql = self._sql

        async def read(conn: Connection) -> list[Any]:
            return list(await conn.fetch(sql["outcome_counts"], since, float(bucket)))

        rows = await self.bridge.run(read, what="outcome_counts")
        return [OutcomeCount(row["start"], row["outcome"], row["n"]) for row in rows]

    async def name_stats(self, since: float) -> Sequence[NameStats]:
        rows = await self._fetch("name_stats", since, what="name stats")
        return name_stats(tuple(row) for row in rows)
