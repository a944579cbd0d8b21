# The PostgreSQL driver's jobs: enqueue, claim (fleet limits, claims ahead), renew, settle.
# Apart because it is the path every job takes; the other capabilities only read or nudge it.
from __future__ import annotations

import asyncio
import functools
import logging
import math
import operator
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import trio

from ..._core.errors import DriverError, JobsError, RowLocked, ValueRefused
from ..._core.logs import log_event
from ..._core.records import (
    Claim,
    ClaimToken,
    Enqueued,
    JobId,
    JobState,
    Lease,
    NewJob,
    RenewResult,
    Settlement,
)
from .._calls import ClaimAsk, ClaimCalls
from .._claim_slots import ClaimSlots
from .._postgres_bridge import Bridge
from .._postgres_plan import enqueue_plan, fetch_on, run_plan_async
from .._postgres_pool import Connection
from .._postgres_sql import Statements
from .._rules import Orphaning, kind_of, log_orphaned
from .._transaction import unwrap
from ..contract import BesideConnection
from ._claim_statements import COPY_AT_LEAST, _claim_arguments, _copy_in, _handed_back
from ._connection import DEAF_POLL, PostgresConnection, T
from ._settle_statements import (
    _applied_in_order,
    _apply_settles,
    _by_kind,
    _renewal,
    _renewed,
    _settle_columns,
    _settlement,
)

# The claims in claim order, as the answer to a claim alone comes: a key made in C, where a
# lambda called once a row was a share of each answer (issue 44).
_CLAIM_ORDER = operator.itemgetter("priority", "run_at", "id")


class _PostgresBeside:
    """The lease lifeline's own connection: plain asyncio, on a loop of its own in the
    lifeline's thread (the trio-asyncio loop belongs to the Trio thread, which is blocked when
    this is used), opened at its first call. Never the event loop policy's loop: importing
    trio_asyncio makes that one a trio-asyncio loop for the whole process (STACK-NOTES)."""

    def __init__(self, bridge: Bridge, sql: Statements, clock: Callable[[], float]) -> None:
        self._bridge = bridge
        self._sql = sql
        self._clock = clock
        self._loop: asyncio.AbstractEventLoop | None = None
        self._conn: Connection | None = None

    def renew(self, leases: Sequence[Lease], *, lease: float) -> frozenset[ClaimToken]:
        rows = self._run(_renewal(self._sql, self._clock(), leases, lease, ()), "renew")
        return _renewed(rows).held

    def settle(self, settlements: Sequence[Settlement]) -> Sequence[JobId]:
        by_kind = _by_kind(settlements)
        apply = _settlement(self._sql, self._clock(), by_kind)

        async def in_transaction(conn: Connection) -> tuple[set[tuple[JobId, str]], set[JobId]]:
            async with conn.transaction():
                return await apply(conn)

        applied, _ = self._run(in_transaction, "settle")
        return _applied_in_order(settlements, applied)

    def _run(self, op: Callable[[Connection], Awaitable[T]], what: str) -> T:
        if self._loop is None:
            self._loop = asyncio.SelectorEventLoop()
        loop = self._loop
        try:
            if self._conn is None or self._conn.is_closed():
                connect = self._bridge.connector(purpose="beside")
                self._conn = loop.run_until_complete(connect())
            conn = self._conn
            return loop.run_until_complete(asyncio.wait_for(op(conn), self._bridge.answer_within))
        except Exception as exc:
            # Whatever state it is in, the next call opens a fresh connection.
            if self._conn is not None:
                self._conn.terminate()
                self._conn = None
            if isinstance(exc, JobsError):
                raise
            if isinstance(exc, TimeoutError):
                raise DriverError(
                    f"no answer from PostgreSQL within {self._bridge.answer_within:g} s during"
                    f" {what} (the lease lifeline's connection)",
                    fix="the worker's own connections retry once its loop runs again",
                ) from exc
            raise self._bridge.translate(exc, f"{what} (the lease lifeline's connection)") from exc

    def close(self) -> None:
        if self._conn is not None:
            self._conn.terminate()
            self._conn = None
        if self._loop is not None:
            self._loop.close()
            self._loop = None


class PostgresJobs(ClaimCalls, PostgresConnection):
    """Enqueue, claim, renew and settle: a job's way from written to ended."""

    # --- enqueue ---

    async def enqueue(
        self, jobs: Sequence[NewJob], *, connection: object | None = None
    ) -> Sequence[Enqueued]:
        self._check_open()
        jobs = list(jobs)
        if not jobs:
            await trio.lowlevel.checkpoint()
            return []
        now = self.now()
        sql = self._sql

        async def write(conn: Connection) -> list[Enqueued]:
            answers: list[Enqueued] = await run_plan_async(
                enqueue_plan(sql, now, jobs), functools.partial(fetch_on, conn)
            )
            return answers

        keyed = any(job.key is not None for job in jobs)
        if not keyed and len(jobs) >= COPY_AT_LEAST:
            # Nothing a key could turn into a no-op: every row is written, by COPY (the rows
            # encoded in asyncpg's C code, no unnest on the server), then one NOTIFY; one
            # transaction, so the wake-up lands with the rows.
            async def write(conn: Connection) -> list[Enqueued]:
                await _copy_in(conn, sql, now, jobs)
                return [Enqueued(job.job_id, created=True) for job in jobs]

            copied = True
        else:
            copied = False
        # A keyed batch is several statements (enqueue_plan says why): one transaction.
        if unwrap(connection)[0] is not None:  # the caller's transaction
            result: list[Enqueued] = await self._run_here_or_on(connection, write, what="enqueue")
        else:
            result = await self.bridge.run(write, what="enqueue", transaction=keyed or copied)
        return result

    # --- claim, renew, settle ---

    async def _claim(self, ask: ClaimAsk) -> Sequence[Claim]:
        queues, limit, lease, worker_id, free, rescue = ask.parts()
        alone = ask.alone
        self._check_open()
        slots = ClaimSlots.of(queues, limit)
        if not slots.caps:
            await trio.lowlevel.checkpoint()
            return []
        now = self.now()
        sql = self._sql
        statement = sql["claim" if rescue else "claim_unrescued"]

        async def take(conn: Connection) -> list[Any]:
            # One statement: the claim and the hand-back of lapsed jobs commit together.
            return list(
                await conn.fetch(
                    statement, *_claim_arguments(now, slots, lease, worker_id, free, rescue, alone)
                )
            )

        rows = await self.bridge.run(take, what="claim")
        claims = await self._claims(rows, now, float(lease), worker_id)
        if _handed_back(rows):
            # The statement handed lapsed jobs back and claimed nothing (its snapshot predates
            # the hand-back): claimed now by a statement that sees them at their place in line
            # and hands no more back, as the other drivers' one claim takes them (Driver.claim).
            claims += await self._claim_made_due(
                limit, slots, claims, lease, worker_id, free, False, alone
            )
        return claims

    async def _settle_and_claim(
        self, settlements: Sequence[Settlement], ask: ClaimAsk
    ) -> tuple[Sequence[JobId], Sequence[Claim]]:
        queues, limit, lease, worker_id, free, rescue = ask.parts()
        alone = ask.alone
        self._check_open()
        slots = ClaimSlots.of(queues, limit)
        by_kind = _by_kind(settlements)
        if not by_kind:
            return [], await self._ask_claim(ask)
        if not slots.caps:
            return await self.settle(settlements), []
        now = self.now()
        sql = self._sql
        claiming = _claim_arguments(now, slots, lease, worker_id, free, rescue, alone)
        # With no lapsed job to hand back, the smaller statements (claim_unrescued, _jobs.sql).
        unrescued = "" if rescue else "_unrescued"
        claim, settle_claim = f"claim{unrescued}", f"settle_claim{unrescued}_"

        async def both(conn: Connection) -> tuple[set[tuple[JobId, str]], list[Any], bool]:
            if len(by_kind) > 1:
                # Several kinds (rare): the settles' statements, then the claim's, in one
                # transaction (run below with transaction=True); the claim's own snapshot
                # sees what the settles changed, a waiter they woke included.
                # Every row locked first (waiting): none is ever skipped as busy here.
                written, _ = await _apply_settles(conn, sql, now, by_kind)
                return written, list(await conn.fetch(sql[claim], *claiming)), False
            # The usual batch, one kind: ONE statement settles and claims, one round trip.
            [(kind, group)] = by_kind.items()
            rows = await conn.fetch(
                sql[settle_claim + kind],
                *claiming,
                sql.channel,
                *_settle_columns(group),
            )
            # One pass over the answer (a batch's settled rows, then its claims): three were
            # a share of a no-op job (issue 44).
            applied: set[tuple[JobId, str]] = set()
            claimed: list[Any] = []
            # One snapshot: a job the settle made due now was not this claim's to see.
            made_due = False
            for row in rows:
                if row["claimed"]:
                    claimed.append(row)
                else:
                    applied.add((row["id"], row["token"]))
                    made_due = made_due or bool(row["made_due"])
            claimed.sort(key=_CLAIM_ORDER)
            return applied, claimed, made_due

        applied, rows, made_due = await self.bridge.run(
            both, what="settle and claim", transaction=len(by_kind) > 1
        )
        claims = await self._claims(rows, now, float(lease), worker_id)
        # A claim that took a suspect took it alone: nothing is claimed beside it. One that
        # handed lapsed jobs back claimed nothing, and hands no more back now (claim()).
        handed_back = _handed_back(rows)
        if (made_due or handed_back) and not any(claim.alone for claim in claims):
            claims += await self._claim_made_due(
                limit,
                slots,
                claims,
                lease,
                worker_id,
                free,
                rescue and not handed_back,
                alone and not claims,
            )
        return _applied_in_order(settlements, applied), claims

    async def _claim_made_due(
        self,
        limit: int | Mapping[str, int],
        slots: ClaimSlots,
        claims: Sequence[Claim],
        lease: float,
        worker_id: str,
        free: Mapping[str, int] | None,
        rescue: bool,
        alone: bool = False,
    ) -> list[Claim]:
        """After settle_and_claim's statement made jobs due now (a retry or suspension without
        delay, a freed fleet slot's waiter): the free capacity it left, claimed as settle() then
        claim() would have (the statement's one snapshot could not see them). The settles
        committed already, so a refusal here costs only this claim (those jobs stay due, for
        the next), never the settles. A failure with no answer is the caller's: this claim may
        have committed, and its jobs, held by nobody, sat running a lease long and were
        orphaned on this live worker (a suspect dead-lettered X_KILLED_WORKER); raised, the
        worker gives back what it does not hold (Worker's lost answer, hand_back_unheld), and
        the settler reads back what it carried before it calls a settlement fenced."""
        taken = Counter(c.queue for c in claims)
        rest: int | dict[str, int]
        if isinstance(limit, int):
            rest = limit - len(claims)
            queues = list(slots.caps)
        else:
            rest = {q: cap - taken[q] for q, cap in slots.caps.items() if cap > taken[q]}
            queues = list(rest)
        if not queues or (isinstance(rest, int) and rest <= 0):
            return []
        still_free = None if free is None else {q: max(n - taken[q], 0) for q, n in free.items()}
        try:
            return list(
                await self.claim(
                    queues,
                    rest,
                    lease=lease,
                    worker_id=worker_id,
                    free=still_free,
                    rescue=rescue,
                    alone=alone,
                )
            )
        except JobsError as exc:
            if _may_have_committed(exc):
                raise
            log_event(
                "jobs.driver.made-due-claim-failed", logging.WARNING, queues=queues, error=str(exc)
            )
            return []

    async def _claims(
        self, rows: Sequence[Any], now: float, lease: float, worker_id: str
    ) -> list[Claim]:
        """The claim statement's rows as claims, in its order. A NULL token is a candidate with
        fleet limits, left for a transaction of its own (_claim_limited); the rest committed
        already, so a refusal there costs only the limited ones their turn (they stay ready,
        untouched), never the claims already made (they would sit claimed till their lease
        lapsed, each an attempt spent). A failure with no answer (its commit may have landed)
        is raised: the worker gives back what it does not hold (_claim_made_due says why)."""
        # One pass over the answer: a claim statement answers up to a batch of rows per round
        # trip, and three passes and keyword arguments per claim were ~1 µs a no-op job.
        kept: list[Any] = []
        limited: list[JobId] = []
        for row in rows:
            released = row["released"]
            if released is not None:
                if released != "unstarted":
                    # The answer's columns for a job handed back (_jobs.sql, claim_answer).
                    rule = Orphaning(
                        JobState(released), row["orphans"], row["payload"], hands_back=True
                    )
                    log_orphaned(row["id"], row["name"], row["context"], row["attempts"], rule)
                continue
            kept.append(row)
            if row["token"] is None:
                limited.append(row["id"])
        if limited:
            granted = {}
            try:
                granted = await self._claim_limited(limited, now, lease, worker_id)
            except JobsError as exc:
                if _may_have_committed(exc):
                    raise
                log_event(
                    "jobs.driver.limited-claim-failed",
                    logging.WARNING,
                    jobs=len(limited),
                    error=str(exc),
                )
            kept = [
                row
                for row in (granted.get(r["id"]) if r["token"] is None else r for r in kept)
                if row is not None
            ]
        return [
            # Positional, in Claim's field order (a keyword call costs a third more): job_id,
            # token, name, queue, payload, attempt, max_attempts, lease_until, context, ahead,
            # due_at, alone (held by the conformance test_each_field_of_a_claim_is_its_jobs...).
            Claim(
                row["id"],
                row["token"],
                row["name"],
                row["queue"],
                row["payload"],
                row["attempts"],
                row["max_attempts"],
                row["lease_until"],
                row["context"],
                row["ahead"],
                row["run_at"],
                row["alone"],
            )
            for row in kept
        ]

    async def renew(
        self, leases: Sequence[Lease], *, lease: float, started: Sequence[ClaimToken] = ()
    ) -> RenewResult:
        self._check_open()
        if not leases:
            await trio.lowlevel.checkpoint()
            return RenewResult(held=frozenset())
        extend = _renewal(self._sql, self.now(), leases, lease, started)
        return _renewed(await self.bridge.run(extend, what="renew"))

    def beside(self) -> BesideConnection:
        return _PostgresBeside(self.bridge, self._sql, self.now)

    async def hand_back_unheld(
        self, worker_id: str, queues: Sequence[str], held: Sequence[ClaimToken]
    ) -> Sequence[JobId]:
        self._check_open()
        sql, now = self._sql, self.now()

        async def mark(conn: Connection) -> list[JobId]:
            rows = await conn.fetch(
                sql["hand_back_unheld"], now, worker_id, list(queues), list(held)
            )
            return [row["id"] for row in rows]

        answered: list[JobId] = await self.bridge.run(mark, what="hand_back_unheld")
        return answered

    async def unmark_alone(self, leases: Sequence[Lease]) -> Sequence[JobId]:
        self._check_open()
        ids, tokens = [one.job_id for one in leases], [one.token for one in leases]

        async def unmark(conn: Connection) -> list[JobId]:
            rows = await conn.fetch(self._sql["unmark_alone"], ids, tokens)
            return [row["id"] for row in rows]

        answered: list[JobId] = await self.bridge.run(unmark, what="unmark_alone")
        return answered

    async def settle(self, settlements: Sequence[Settlement]) -> Sequence[JobId]:
        self._check_open()
        by_kind = _by_kind(settlements)
        if not by_kind:
            await trio.lowlevel.checkpoint()
            return []
        apply = _settlement(self._sql, self.now(), by_kind)
        # One kind (the usual batch: N completes) is one statement; several kinds are one
        # transaction, so a batch never half-applies.
        applied, busy = await self.bridge.run(apply, what="settle", transaction=len(by_kind) > 1)
        if any(kind_of(group[0]).moves_run_at for group in by_kind.values()):
            # A retry's backoff or a suspension's wake-up is a due time this process's own wait
            # for work did not know when it planned: it waits until the soonest run_at or lapse
            # it read, and for a job still running that was its lease's end. An idle worker
            # then ran a 1 s step.sleep at the lease's end, 8 s later (30 s at --lease 30).
            # SQLite wakes on every settle; here a look again, only after such settles.
            self._listener.wake(None)
        written = _applied_in_order(settlements, applied)
        if busy:
            # Committed, but for rows another session holds locked: say which were written
            # and which wait, so the settler writes those again and only those.
            raise RowLocked(
                f"{len(busy)} of the settle's rows are locked by another session",
                fix="find the session that holds them (pg_locks joined to pg_stat_activity: a"
                " transaction left open by hand?) and end it; those settlements are written"
                " again, and only those jobs wait",
                written=frozenset(written),
                busy=frozenset(busy),
            )
        return written

    # --- wake-ups ---

    async def _wait_for_work(
        self, queues: Sequence[str], timeout: float, rescue_from: float | None, alone: bool
    ) -> None:
        self._check_open()
        with self._listener.waiting(queues) as woken:
            # LISTEN (the first time) before the look: an enqueue committed after the look then
            # notifies us, and one committed before it is seen by it.
            await self._listener.listen()
            try:
                due_in = await self._next_due_in(queues, rescue_from, alone)
            except DriverError as exc:
                # The database is away: fall back to polling on the timeout, so the caller's
                # next claim finds out whether it came back.
                log_event("jobs.driver.wait-degraded", logging.WARNING, error=exc.cause)
                due_in = math.inf
            if due_in <= 0:
                return
            if not self._listener.connected:
                # Deaf until the LISTEN connection is back: a caller's slow safety poll would
                # leave an enqueue unseen that long. (The listener wakes every waiter when it
                # loses its connection and again when it has it back.)
                timeout = min(timeout, DEAF_POLL)
            with trio.move_on_after(max(min(timeout, due_in), 0.0)):
                await woken.wait()

    async def _next_due_in(
        self, queues: Sequence[str], rescue_from: float | None = None, alone: bool = False
    ) -> float:
        if not queues:
            await trio.lowlevel.checkpoint()
            return math.inf
        sql = self._sql
        lapses_from = -math.inf if rescue_from is None else rescue_from

        async def read(conn: Connection) -> float | None:
            value: float | None = await conn.fetchval(
                sql["next_due"], list(queues), lapses_from, alone
            )
            return value

        soonest = await self.bridge.run(read, what="wait_for_work")
        return math.inf if soonest is None else soonest - self.now()


def _may_have_committed(exc: JobsError) -> bool:
    """Whether a claim that raised ``exc`` may have committed all the same: a failure with no
    answer (the connection dropped), not a refusal (a value, a lock), which wrote nothing."""
    return isinstance(exc, DriverError) and not isinstance(exc, (ValueRefused, RowLocked))
