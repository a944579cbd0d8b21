# The SQLite driver's outbox and relay: rows written beside the application's data, moved to jobs.
# Apart because the relay's fencing (tickets, decisions) is a protocol of its own.
from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Sequence

import trio

from ..._core.records import (
    OUTBOX_COLUMNS,
    JobId,
    NewJob,
    OutboxBatch,
    OutboxStats,
    RelayDecision,
    RelayHold,
    RelayOutcome,
    new_token,
    outbox_job,
)
from .._calls import RelayAsk, RelayCalls
from .._rows import limit_fields
from .._rules import refuse_in_place, relay_fenced, ticket_stale_at
from .._sqlite_enqueue import insert_jobs
from .._transaction import unwrap
from ..contract import Driver
from ._connection import SqliteConnection


def _decide(
    conn: sqlite3.Connection, jobs: Sequence[NewJob], now: float, source: str | None
) -> list[RelayDecision]:
    """Each outbox row's decision, inside the caller's write transaction: the one on record,
    else made now by writing its job as enqueue would (and recorded, with ``source``; None:
    in place, where the row goes with the job and nothing needs recording)."""
    ids = json.dumps([job.job_id for job in jobs])
    on_record = {
        row[0]: RelayDecision(row[0], RelayOutcome(row[1]), row[2], row[3], already=True)
        for row in conn.execute(
            "SELECT id, outcome, holder, decided_at FROM outbox_decisions"
            " WHERE id IN (SELECT value FROM json_each(?))",
            (ids,),
        )
    }
    # Stored with no decision on record: relayed by a release before decisions were kept.
    stored = [
        row[0]
        for row in conn.execute(
            "SELECT id FROM jobs WHERE id IN (SELECT value FROM json_each(?))", (ids,)
        )
        if row[0] not in on_record
    ]
    made = {i: RelayDecision(i, RelayOutcome.CREATED, i, now, already=True) for i in stored}
    fresh = [job for job in jobs if job.job_id not in on_record and job.job_id not in made]
    for job, answer in zip(fresh, insert_jobs(conn, fresh, now), strict=True):
        outcome = RelayOutcome.CREATED if answer.created else RelayOutcome.KEY_HELD
        made[job.job_id] = RelayDecision(job.job_id, outcome, answer.job_id, now)
    if source is not None:
        conn.executemany(
            "INSERT INTO outbox_decisions (id, source, outcome, holder, decided_at)"
            " VALUES (?, ?, ?, ?, ?)",
            [(d.job_id, source, d.outcome.value, d.holder, d.decided_at) for d in made.values()],
        )
    on_record.update(made)
    return [on_record[job.job_id] for job in jobs]


def _same_file(here: str, there: str) -> bool:
    try:
        return os.path.samefile(here, there)
    except OSError:
        return False


class SqliteOutboxAndRelay(RelayCalls, SqliteConnection):
    """The transactional outbox and the relay that moves its rows into jobs."""

    # The outbox.

    async def outbox_write(
        self, jobs: Sequence[NewJob], *, connection: object | None = None
    ) -> None:
        jobs = list(jobs)
        conn, tx = unwrap(connection)

        def work(conn: sqlite3.Connection, now: float) -> None:
            conn.executemany(
                f"INSERT INTO outbox ({OUTBOX_COLUMNS}, created_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (
                        job.job_id,
                        job.name,
                        job.queue,
                        job.payload,
                        job.priority,
                        job.max_attempts,
                        job.key,
                        now + max(job.delay, 0.0),
                        job.context,
                        *limit_fields(job.limits).values(),
                        now,
                    )
                    for job in jobs
                ],
            )

        if conn is not None:
            await self._on_callers(conn, tx, work, wake=False)
        else:
            await self._transact(work)

    async def outbox_claim(
        self, limit: int, *, lease: float, relay_id: str, ticket: str
    ) -> OutboxBatch:
        def work(conn: sqlite3.Connection, now: float) -> OutboxBatch:
            # Under BEGIN IMMEDIATE: two relays (or processes) never take the same row while
            # its hold is live. A row's past holders are kept (superseded, a JSON array): the
            # write of this batch revokes every one of them.
            rows = conn.execute(
                "UPDATE outbox SET claimed_until = ?, relay_id = ?, ticket = ?,"
                " superseded = CASE WHEN ticket IS NULL THEN superseded"
                "  ELSE json_insert(coalesce(superseded, '[]'), '$[#]', ticket) END"
                " WHERE seq IN"
                " (SELECT seq FROM outbox WHERE claimed_until IS NULL OR claimed_until <= ?"
                "  ORDER BY seq LIMIT ?)"
                f" RETURNING seq, {OUTBOX_COLUMNS}, superseded",
                (now + lease, relay_id, ticket, now, max(limit, 0)),
            ).fetchall()
            rows.sort()  # RETURNING promises no order: relay in the order written
            before = [t for row in rows if row[-1] for t in json.loads(row[-1])]
            return OutboxBatch(
                tuple(outbox_job(row[1:-1], now) for row in rows),
                ticket,
                tuple(dict.fromkeys(before)),
            )

        return await self._transact(work)

    async def outbox_delete(
        self, job_ids: Sequence[JobId], *, ticket: str | None = None
    ) -> Sequence[JobId]:
        ids = json.dumps(list(job_ids))

        def work(conn: sqlite3.Connection, now: float) -> list[JobId]:
            gone = {
                row[0]
                for row in conn.execute(
                    "DELETE FROM outbox WHERE id IN (SELECT value FROM json_each(?))"
                    " AND (? IS NULL OR ticket = ?) RETURNING id",
                    (ids, ticket, ticket),
                )
            }
            return [job_id for job_id in dict.fromkeys(job_ids) if job_id in gone]

        return await self._transact(work)

    async def outbox_stats(self) -> OutboxStats:
        def work(conn: sqlite3.Connection, now: float) -> OutboxStats:
            count, oldest = conn.execute("SELECT count(*), min(created_at) FROM outbox").fetchone()
            held = conn.execute(
                "SELECT relay_id, count(*), max(claimed_until) FROM outbox"
                " WHERE relay_id IS NOT NULL AND claimed_until IS NOT NULL"
                " GROUP BY relay_id ORDER BY relay_id"
            ).fetchall()
            return OutboxStats(
                pending=count,
                oldest_age=None if oldest is None else now - oldest,
                held=tuple(RelayHold(*row) for row in held),
            )

        return await self._transact(work, mode="read")

    async def outbox_present(self, job_ids: Sequence[JobId]) -> Sequence[JobId]:
        ids = json.dumps(list(job_ids))

        def work(conn: sqlite3.Connection, now: float) -> list[JobId]:
            there = {
                row[0]
                for row in conn.execute(
                    "SELECT id FROM outbox WHERE id IN (SELECT value FROM json_each(?))", (ids,)
                )
            }
            return [job_id for job_id in job_ids if job_id in there]

        return await self._transact(work, mode="read")

    async def outbox_source(self) -> str:
        def work(conn: sqlite3.Connection, now: float) -> str:
            return str(conn.execute("SELECT id FROM outbox_source").fetchone()[0])

        return await self._transact(work, mode="read")

    # The relay's decisions.

    async def relay_ticket(self, source: str, *, relay_id: str, lease: float) -> str:
        ticket = new_token()

        def work(conn: sqlite3.Connection, now: float) -> None:
            conn.execute("DELETE FROM relay_tickets WHERE stale_at <= ?", (now,))
            conn.execute(
                "INSERT INTO relay_tickets (ticket, source, relay_id, stale_at)"
                " VALUES (?, ?, ?, ?)",
                (ticket, source, relay_id, ticket_stale_at(now, lease)),
            )

        await self._transact(work)
        return ticket

    async def _relay_enqueue(self, ask: RelayAsk) -> Sequence[RelayDecision]:
        jobs, source, ticket, superseded = ask.parts()
        jobs = list(jobs)
        revoked = json.dumps(list(superseded))

        def work(conn: sqlite3.Connection, now: float) -> list[RelayDecision]:
            # Under BEGIN IMMEDIATE: no other writer can revoke the ticket or decide one of
            # these rows between this fence, this look and the write.
            conn.execute(
                "DELETE FROM relay_tickets WHERE ticket IN (SELECT value FROM json_each(?))",
                (revoked,),
            )
            if not conn.execute("DELETE FROM relay_tickets WHERE ticket = ?", (ticket,)).rowcount:
                raise relay_fenced(ticket, len(jobs))
            return _decide(conn, jobs, now, source)

        decisions = await self._transact(work)
        self._wake()
        return decisions

    async def relay_forget(self, source: str, job_ids: Sequence[JobId]) -> int:
        ids = json.dumps(list(job_ids))

        def work(conn: sqlite3.Connection, now: float) -> int:
            return conn.execute(
                "DELETE FROM outbox_decisions WHERE source = ?"
                " AND id IN (SELECT value FROM json_each(?))",
                (source, ids),
            ).rowcount

        return await self._transact(work)

    async def relay_decisions(self, source: str, *, before: float, limit: int) -> Sequence[JobId]:
        def work(conn: sqlite3.Connection, now: float) -> list[JobId]:
            return [
                row[0]
                for row in conn.execute(
                    "SELECT id FROM outbox_decisions WHERE source = ? AND decided_at < ?"
                    " ORDER BY decided_at LIMIT ?",
                    (source, before, max(limit, 0)),
                )
            ]

        return await self._transact(work, mode="read")

    async def shares_outbox(self, outbox: Driver) -> bool:
        # One file, whatever the two drivers' paths spell: its outbox table is this one. (A
        # copy of the file is another file, with the same outbox_source id: hence the path.)
        if not isinstance(outbox, SqliteConnection):
            await trio.lowlevel.checkpoint()
            return False
        return await trio.to_thread.run_sync(_same_file, self.path, outbox.path)

    async def relay_in_place(self, outbox: Driver, limit: int) -> Sequence[RelayDecision]:
        if not await self.shares_outbox(outbox):
            raise refuse_in_place("SQLite")

        def work(conn: sqlite3.Connection, now: float) -> list[RelayDecision]:
            # One BEGIN IMMEDIATE: the rows, their jobs and the rows' removal commit together,
            # and no other relay takes a row meanwhile (SQLite has one writer).
            rows = conn.execute(
                f"SELECT seq, {OUTBOX_COLUMNS}, ticket, superseded FROM outbox"
                " WHERE claimed_until IS NULL OR claimed_until <= ? ORDER BY seq LIMIT ?",
                (now, max(limit, 0)),
            ).fetchall()
            jobs = [outbox_job(row[1:-2], now) for row in rows]
            decisions = _decide(conn, jobs, now, None)
            # A two-step relay that held one of these rows may wake from a pause: fenced.
            held = [t for row in rows for t in (row[-2], *json.loads(row[-1] or "[]")) if t]
            conn.execute(
                "DELETE FROM relay_tickets WHERE ticket IN (SELECT value FROM json_each(?))",
                (json.dumps(held),),
            )
            ids = json.dumps([job.job_id for job in jobs])
            for table in ("outbox", "outbox_decisions"):
                conn.execute(
                    f"DELETE FROM {table} WHERE id IN (SELECT value FROM json_each(?))", (ids,)
                )
            return decisions

        decisions = await self._transact(work)
        if decisions:
            self._wake()
        return decisions
