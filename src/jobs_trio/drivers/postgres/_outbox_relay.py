# The PostgreSQL driver's outbox and relay: rows written beside the application's data, relayed.
# Apart because the relay's fencing (tickets, decisions) is a protocol of its own.
from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, cast

import trio

from ..._core.chunks import enqueue_chunks
from ..._core.errors import DriverError, JobsError
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
from .._postgres_plan import KEY_ROUNDS, job_columns, limit_columns
from .._postgres_pool import LIFT_IDLE_BOUND, Connection
from .._postgres_sql import Statements
from .._rules import refuse_in_place, relay_fenced, ticket_stale_at
from ..contract import Driver
from ._connection import PostgresConnection


class _DecidedMeanwhile(JobsError):
    """Another relay recorded a decision for one of these rows since this write looked: roll
    the write back (its jobs too) and make it again. A JobsError so the bridge hands it
    through as it is."""


_OUTBOX_FIELDS = tuple(name.strip() for name in OUTBOX_COLUMNS.split(","))


def _outbox_jobs(rows: Sequence[Any], now: float) -> list[NewJob]:
    return [outbox_job(tuple(row[name] for name in _OUTBOX_FIELDS), now) for row in rows]


async def _decide(
    conn: Connection, sql: Statements, now: float, jobs: Sequence[NewJob], source: str | None
) -> list[RelayDecision]:
    """Each outbox row's decision, inside the caller's transaction: the one on record, else
    made now by writing its job as enqueue would (and recorded, with ``source``; None: in
    place, where the row goes with the job and nothing needs recording)."""
    on_record = {
        row["id"]: RelayDecision(
            row["id"], RelayOutcome(row["outcome"]), row["holder"], row["decided_at"], True
        )
        for row in await conn.fetch(sql["relay_on_record"], [job.job_id for job in jobs])
    }
    made: dict[JobId, RelayDecision] = {}
    pending = [job for job in jobs if job.job_id not in on_record]
    for _ in range(KEY_ROUNDS):
        if not pending:
            break
        created: set[JobId] = set()
        for chunk in enqueue_chunks(pending):  # a relay batch of large rows: no 1 GB statement
            created.update(
                row["id"]
                for row in await conn.fetch(
                    sql["enqueue_once"],
                    now,
                    *job_columns(chunk),
                    sql.channel,
                    *limit_columns(chunk),
                )
            )
        made.update((i, RelayDecision(i, RelayOutcome.CREATED, i, now)) for i in created)
        rest = [job for job in pending if job.job_id not in created]
        if rest:
            # Stored with no decision on record: relayed by a release before decisions were
            # kept (or by a relay beside this one, whose decision then conflicts below).
            for row in await conn.fetch(sql["stored_ids"], [job.job_id for job in rest]):
                made[row["id"]] = RelayDecision(
                    row["id"], RelayOutcome.CREATED, row["id"], now, True
                )
            keys = [job.key for job in rest if job.job_id not in made]
            if keys:
                holders = {
                    row["key"]: row["id"] for row in await conn.fetch(sql["live_key_holders"], keys)
                }
                for job in rest:
                    if job.job_id not in made and job.key in holders:
                        made[job.job_id] = RelayDecision(
                            job.job_id, RelayOutcome.KEY_HELD, holders[job.key], now
                        )
        # A key whose holder finished between the insert and the look: written again.
        pending = [job for job in rest if job.job_id not in made]
    if pending:
        raise DriverError(
            f"could not settle unique keys {[job.key for job in pending]}: their holders kept"
            " finishing and being replaced while the relay wrote them",
            fix="nothing to do: the relay tries these rows again on its next pass",
        )
    if source is not None and made:
        decided = list(made.values())
        recorded = await conn.fetch(
            sql["relay_record"],
            source,
            now,
            [d.job_id for d in decided],
            [d.outcome.value for d in decided],
            [d.holder for d in decided],
        )
        if len(recorded) < len(decided):
            raise _DecidedMeanwhile("an outbox row was decided by another relay meanwhile")
    on_record.update(made)
    return [on_record[job.job_id] for job in jobs]


class PostgresOutboxAndRelay(RelayCalls, PostgresConnection):
    """The transactional outbox and the relay that moves its rows into jobs."""

    # --- the outbox ---

    async def outbox_write(
        self, jobs: Sequence[NewJob], *, connection: object | None = None
    ) -> None:
        self._check_open()
        jobs = list(jobs)
        if not jobs:
            await trio.lowlevel.checkpoint()
            return
        now = self.now()
        sql = self._sql

        async def write(conn: Connection) -> None:
            await conn.execute(sql["outbox_write"], now, *job_columns(jobs), *limit_columns(jobs))

        await self._run_here_or_on(connection, write, what="outbox write")

    async def outbox_claim(
        self, limit: int, *, lease: float, relay_id: str, ticket: str
    ) -> OutboxBatch:
        self._check_open()
        now = self.now()
        sql = self._sql

        async def take(conn: Connection) -> list[Any]:
            return list(
                await conn.fetch(
                    sql["outbox_claim"], now, float(lease), max(limit, 0), relay_id, ticket
                )
            )

        rows = sorted(await self.bridge.run(take, what="outbox claim"), key=lambda r: r["seq"])
        before = [t for row in rows for t in row["superseded"] or ()]
        return OutboxBatch(tuple(_outbox_jobs(rows, now)), ticket, tuple(dict.fromkeys(before)))

    async def outbox_delete(
        self, job_ids: Sequence[JobId], *, ticket: str | None = None
    ) -> Sequence[JobId]:
        self._check_open()
        sql = self._sql

        async def delete(conn: Connection) -> set[JobId]:
            return {
                row["id"] for row in await conn.fetch(sql["outbox_delete"], list(job_ids), ticket)
            }

        gone = await self.bridge.run(delete, what="outbox delete")
        return [job_id for job_id in dict.fromkeys(job_ids) if job_id in gone]

    async def outbox_stats(self) -> OutboxStats:
        self._check_open()
        now = self.now()
        sql = self._sql

        async def read(conn: Connection) -> tuple[Any, list[Any]]:
            return await conn.fetchrow(sql["outbox_stats"]), list(
                await conn.fetch(sql["outbox_holds"])
            )

        row, holds = await self.bridge.run(read, what="outbox stats")
        oldest = row["oldest"]
        return OutboxStats(
            pending=row["pending"],
            oldest_age=None if oldest is None else now - oldest,
            held=tuple(RelayHold(h["relay_id"], h["rows"], h["until"]) for h in holds),
        )

    async def outbox_present(self, job_ids: Sequence[JobId]) -> Sequence[JobId]:
        rows = await self._fetch("outbox_present", list(job_ids), what="outbox present")
        there = {row["id"] for row in rows}
        return [job_id for job_id in job_ids if job_id in there]

    async def outbox_source(self) -> str:
        self._check_open()
        if self._outbox_source is None:
            sql = self._sql

            async def read(conn: Connection) -> str:
                return str(await conn.fetchval(sql["outbox_source"]))

            self._outbox_source = await self.bridge.run(read, what="outbox source")
        else:
            await trio.lowlevel.checkpoint()
        return self._outbox_source

    # --- the relay's decisions ---

    async def relay_ticket(self, source: str, *, relay_id: str, lease: float) -> str:
        self._check_open()
        now = self.now()
        sql = self._sql
        ticket = new_token()

        async def record(conn: Connection) -> None:
            await conn.execute(
                sql["relay_ticket"], now, ticket, source, relay_id, ticket_stale_at(now, lease)
            )

        await self.bridge.run(record, what="relay ticket")
        return ticket

    async def _relay_enqueue(self, ask: RelayAsk) -> Sequence[RelayDecision]:
        jobs, source, ticket, superseded = ask.parts()
        self._check_open()
        jobs = list(jobs)
        sql = self._sql
        revoked = list(superseded)

        async def write(conn: Connection, now: float) -> list[RelayDecision]:
            # The fence first, in the write's own transaction: a ticket revoked here is waited
            # for if its relay is writing right now (then its decisions are what _decide reads),
            # and a write that comes after finds its own ticket gone.
            await conn.execute(sql["relay_revoke"], revoked)
            if await conn.fetchval(sql["relay_spend"], ticket) is None:
                raise relay_fenced(ticket, len(jobs))
            return await _decide(conn, sql, now, jobs, source)

        for _ in range(KEY_ROUNDS):
            try:
                decisions: list[RelayDecision] = await self.bridge.run(
                    functools.partial(write, now=self.now()), what="relay enqueue", transaction=True
                )
            except _DecidedMeanwhile:
                continue  # rolled back; made again, it answers the other relay's decisions
            return decisions
        raise DriverError(
            "another relay kept deciding these outbox rows while this one wrote them",
            fix="nothing to do: the rows stay in the outbox and the next pass tries again",
        )

    async def relay_forget(self, source: str, job_ids: Sequence[JobId]) -> int:
        gone: int = await self._fetchval("relay_forget", source, list(job_ids), what="relay forget")
        return gone

    async def relay_decisions(self, source: str, *, before: float, limit: int) -> Sequence[JobId]:
        self._check_open()
        sql = self._sql

        async def read(conn: Connection) -> list[JobId]:
            rows = await conn.fetch(sql["relay_decisions"], source, float(before), max(limit, 0))
            return [row["id"] for row in rows]

        ids: list[JobId] = await self.bridge.run(read, what="relay decisions")
        return ids

    async def shares_outbox(self, outbox: Driver) -> bool:
        self._check_open()
        # The driver itself, told by identity (cast: this room alone is no Driver to mypy).
        if outbox is cast(object, self):
            await trio.lowlevel.checkpoint()
            return True
        if not isinstance(outbox, PostgresOutboxAndRelay):
            await trio.lowlevel.checkpoint()
            return False
        if outbox in self._shares_with:
            await trio.lowlevel.checkpoint()
            return True
        # Written through the outbox's connections, read through ours: seen, one database. A
        # URL cannot tell (host aliases, a pooler, a cloned database with the same tables).
        probe = new_token()
        await outbox._write_probe(probe)
        there = outbox._sql

        async def read(conn: Connection) -> str | None:
            import asyncpg

            if await conn.fetchval("SELECT to_regclass($1)", f'"{there.schema}".outbox_source'):
                try:
                    seen: str | None = await conn.fetchval(there["outbox_probe_read"])
                    return seen
                except asyncpg.exceptions.InsufficientPrivilegeError:
                    return None  # a table we may not read is no outbox we can move in place
            return None

        if await self.bridge.run(read, what="outbox probe") != probe:
            return False
        self._shares_with.add(outbox)  # asked again by every pass in place: once is enough
        return True

    async def _write_probe(self, probe: str) -> None:
        await self._execute("outbox_probe_write", probe, what="outbox probe")

    async def relay_in_place(self, outbox: Driver, limit: int) -> Sequence[RelayDecision]:
        self._check_open()
        if not isinstance(outbox, PostgresOutboxAndRelay) or not await self.shares_outbox(outbox):
            raise refuse_in_place("PostgreSQL")
        sql, there = self._sql, outbox._sql
        now = self.now()

        async def move(conn: Connection) -> list[RelayDecision]:
            # One transaction on one connection: the rows stay locked (FOR UPDATE) until the
            # commit that writes their jobs and deletes them, or the rollback that leaves them.
            # The rows become jobs in Python between two of this transaction's statements, in
            # time that grows with the batch: past the pool's bound on a transaction left idle
            # (_postgres_pool.py; 0.9 s for 150,000 rows here, more under load) the server ended
            # every pass of a large --batch, and the outbox never drained. Lifted for this one:
            # a relay stopped inside it holds only its own batch's rows.
            await conn.execute(LIFT_IDLE_BOUND)
            rows = await conn.fetch(there["outbox_take_here"], now, max(limit, 0))
            jobs = _outbox_jobs(sorted(rows, key=lambda r: r["seq"]), now)
            if not jobs:
                return []
            decisions = await _decide(conn, sql, now, jobs, None)
            # A two-step relay that held one of these rows may wake from a pause: fenced.
            held = [t for r in rows for t in (r["ticket"], *(r["superseded"] or ())) if t]
            await conn.execute(sql["relay_revoke"], held)
            ids = [job.job_id for job in jobs]
            await conn.execute(there["outbox_delete"], ids, None)
            await conn.execute(sql["relay_forget_any"], ids)
            return decisions

        decisions: list[RelayDecision] = await self.bridge.run(
            move, what="relay in place", transaction=True
        )
        return decisions
