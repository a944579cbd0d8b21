# The memory driver's outbox and relay: rows written beside the application's data, moved to jobs.
# Apart because the relay's fencing (tickets, decisions) is a protocol of its own.
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import cast

import attrs
import trio

from ..._core.records import (
    JobId,
    NewJob,
    OutboxBatch,
    OutboxStats,
    RelayDecision,
    RelayHold,
    RelayOutcome,
    new_token,
)
from .._calls import RelayAsk, RelayCalls
from .._rules import (
    refuse_in_place,
    relay_fenced,
    ticket_stale_at,
)
from .._transaction import unwrap
from ..contract import Driver
from ._store import MemoryStore, _OutboxRow


def _is_this(outbox: Driver, store: MemoryStore) -> bool:
    # The driver itself, told by identity: typed apart because this room alone is no Driver.
    return outbox is cast(object, store)


class MemoryOutboxAndRelay(RelayCalls, MemoryStore):
    """The transactional outbox and the relay that moves its rows into jobs."""

    # The outbox.

    async def outbox_write(
        self, jobs: Sequence[NewJob], *, connection: object | None = None
    ) -> None:
        await self._write_alone(
            unwrap(connection)[0],
            fix="write to the outbox outside jobs_trio.transaction(), or use SQLite or"
            " PostgreSQL for the application's database",
        )
        now = self.now()
        for job in jobs:
            self._outbox[job.job_id] = _OutboxRow(job, now + max(job.delay, 0.0), now)

    async def outbox_claim(
        self, limit: int, *, lease: float, relay_id: str, ticket: str
    ) -> OutboxBatch:
        await trio.lowlevel.checkpoint()
        self._check_open()
        now = self.now()
        taken: list[NewJob] = []
        superseded: dict[str, None] = {}
        for job_id, row in self._outbox.items():
            if len(taken) >= limit:
                break
            if row.claimed_until is not None and row.claimed_until > now:
                continue
            before = row.superseded + ((row.ticket,) if row.ticket is not None else ())
            superseded.update(dict.fromkeys(before))
            self._outbox[job_id] = attrs.evolve(
                row, claimed_until=now + lease, relay_id=relay_id, ticket=ticket, superseded=before
            )
            taken.append(attrs.evolve(row.job, delay=max(row.run_at - now, 0.0)))
        return OutboxBatch(tuple(taken), ticket, tuple(superseded))

    async def outbox_delete(
        self, job_ids: Sequence[JobId], *, ticket: str | None = None
    ) -> Sequence[JobId]:
        await trio.lowlevel.checkpoint()
        self._check_open()
        gone = [
            job_id
            for job_id in dict.fromkeys(job_ids)
            if job_id in self._outbox and ticket in (None, self._outbox[job_id].ticket)
        ]
        for job_id in gone:
            del self._outbox[job_id]
        return gone

    async def outbox_stats(self) -> OutboxStats:
        await trio.lowlevel.checkpoint()
        self._check_open()
        oldest = min((row.created_at for row in self._outbox.values()), default=None)
        holds: dict[str, tuple[int, float]] = {}
        for row in self._outbox.values():
            if row.relay_id is not None and row.claimed_until is not None:
                rows, until = holds.get(row.relay_id, (0, -math.inf))
                holds[row.relay_id] = (rows + 1, max(until, row.claimed_until))
        return OutboxStats(
            pending=len(self._outbox),
            oldest_age=None if oldest is None else self.now() - oldest,
            held=tuple(RelayHold(r, n, until) for r, (n, until) in sorted(holds.items())),
        )

    async def outbox_present(self, job_ids: Sequence[JobId]) -> Sequence[JobId]:
        await trio.lowlevel.checkpoint()
        self._check_open()
        return [job_id for job_id in job_ids if job_id in self._outbox]

    async def outbox_source(self) -> str:
        await trio.lowlevel.checkpoint()
        self._check_open()
        return self._outbox_source

    # The relay's decisions.

    async def relay_ticket(self, source: str, *, relay_id: str, lease: float) -> str:
        await trio.lowlevel.checkpoint()
        self._check_open()
        now = self.now()
        for stale in [t for t, (_, stale_at) in self._tickets.items() if stale_at <= now]:
            del self._tickets[stale]
        ticket = new_token()
        self._tickets[ticket] = (source, ticket_stale_at(now, lease))
        return ticket

    async def _relay_enqueue(self, ask: RelayAsk) -> Sequence[RelayDecision]:
        jobs, source, ticket, superseded = ask.parts()
        await trio.lowlevel.checkpoint()
        self._check_open()
        # No checkpoint between the fence, the look and the write: no other task runs between.
        for revoked in superseded:
            self._tickets.pop(revoked, None)
        if self._tickets.pop(ticket, None) is None:
            raise relay_fenced(ticket, len(jobs))
        return self._decide(jobs, self.now(), source)

    async def relay_forget(self, source: str, job_ids: Sequence[JobId]) -> int:
        await trio.lowlevel.checkpoint()
        self._check_open()
        gone = [i for i in job_ids if i in self._decisions and self._decisions[i][0] == source]
        for job_id in gone:
            del self._decisions[job_id]
        return len(gone)

    async def relay_decisions(self, source: str, *, before: float, limit: int) -> Sequence[JobId]:
        await trio.lowlevel.checkpoint()
        self._check_open()
        old = sorted(
            (decision.decided_at, job_id)
            for job_id, (of, decision) in self._decisions.items()
            if of == source and decision.decided_at < before
        )
        return [job_id for _, job_id in old[: max(limit, 0)]]

    async def shares_outbox(self, outbox: Driver) -> bool:
        await trio.lowlevel.checkpoint()
        return _is_this(outbox, self)

    async def relay_in_place(self, outbox: Driver, limit: int) -> Sequence[RelayDecision]:
        await trio.lowlevel.checkpoint()
        self._check_open()
        if not _is_this(outbox, self):
            raise refuse_in_place("memory")
        now = self.now()
        taken = [
            job_id
            for job_id, row in self._outbox.items()
            if row.claimed_until is None or row.claimed_until <= now
        ][: max(limit, 0)]
        rows = [self._outbox.pop(job_id) for job_id in taken]
        jobs = [attrs.evolve(row.job, delay=max(row.run_at - now, 0.0)) for row in rows]
        for row in rows:  # a two-step relay that held one may wake from a pause: fenced
            for revoked in (*row.superseded, row.ticket):
                self._tickets.pop(revoked or "", None)
        decisions = self._decide(jobs, now, None)
        for job_id in taken:
            self._decisions.pop(job_id, None)  # the row is gone: nothing can take it again
        return decisions

    def _decide(
        self, jobs: Sequence[NewJob], now: float, source: str | None
    ) -> list[RelayDecision]:
        """Each row's decision: the one on record, else made now (and recorded, unless
        ``source`` is None: in place, the row goes with the job)."""
        on_record = {
            job.job_id: attrs.evolve(self._decisions[job.job_id][1], already=True)
            for job in jobs
            if job.job_id in self._decisions
        }
        # Relayed before decisions were recorded (a release before them): created, and done.
        on_record.update(
            (job.job_id, RelayDecision(job.job_id, RelayOutcome.CREATED, job.job_id, now, True))
            for job in jobs
            if job.job_id not in on_record and job.job_id in self._jobs
        )
        fresh = [job for job in jobs if job.job_id not in on_record]
        for job, answer in zip(fresh, self._insert(fresh, now), strict=True):
            decision = RelayDecision(
                job.job_id,
                RelayOutcome.CREATED if answer.created else RelayOutcome.KEY_HELD,
                answer.job_id,
                now,
            )
            on_record[job.job_id] = decision
            if source is not None:
                self._decisions[job.job_id] = (source, decision)
        if fresh:
            self._wake()
        return [on_record[job.job_id] for job in jobs]
