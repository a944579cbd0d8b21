# The PostgreSQL driver: the Driver contract in SQL (SKIP LOCKED claims, fenced settles in
# batches, LISTEN/NOTIFY wake-ups), for fleets of workers on any number of machines. Apart from
# the bridge, listener and migrations so that this module reads as the contract, one method each.
from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import math
import time
import weakref
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar, cast

import attrs
import trio

from .._core.errors import DriverError, JobsError, RowLocked
from .._core.logs import log_event
from .._core.operator_transitions import (
    OPERATOR_CANCEL_ERROR,
    cancel_flags_only,
    cancel_instead,
    check_delete,
    check_retry,
    check_run_now,
    found,
    key_held,
)
from .._core.records import (
    OUTBOX_COLUMNS,
    AttemptRecord,
    Claim,
    ClaimToken,
    Complete,
    Enqueued,
    EventLook,
    EventRecord,
    JobId,
    JobLimits,
    JobRecord,
    JobState,
    Lease,
    NameStats,
    NewJob,
    OutboxBatch,
    OutboxStats,
    OutcomeCount,
    PauseHolder,
    PauseLook,
    Pruned,
    PruneTurn,
    QueuePause,
    QueueStats,
    RelayDecision,
    RelayHold,
    RelayOutcome,
    RenewResult,
    Settlement,
    StepRecord,
    StepStatus,
    TaskAdvance,
    TaskMark,
    WorkerPresence,
    new_token,
    outbox_job,
)
from ._claim_slots import ClaimSlots
from ._fleet_stats import decode as decode_fleet_stats
from ._fleet_stats import encode as encode_fleet_stats
from ._limit_rules import LimitRow, decide, needs
from ._postgres_bridge import ROW_LOCK_STATES, Bridge, open_bridge, sole_error
from ._postgres_listener import PAUSES_CHANGED, Listener
from ._postgres_migrate import apply_migrations, check_migrated, holders_namer, migrate
from ._postgres_plan import (
    KEY_ROUNDS,
    enqueue_plan,
    event_plan,
    fetch_on,
    insert_query,
    job_columns,
    limit_columns,
    run_plan_async,
)
from ._postgres_pool import Connection, session_settings
from ._postgres_pooler import Pooler
from ._postgres_sql import Statements, load_statements
from ._postgres_transaction import open_pooled_transaction
from ._retention import cutoffs, turn_is_free
from ._rules import (
    FIRE_HISTORY,
    FORGET_WORKERS_AFTER,
    LAPSED_ERROR,
    LAPSED_OUT_OF_ATTEMPTS,
    decode_jobs,
    driver_closed,
    effect,
    encode_jobs,
    history_outcome,
    job_record,
    kind_of,
    limit_fields,
    name_stats,
    queue_stats,
    refuse_in_place,
    relay_fenced,
    ticket_stale_at,
)
from ._transaction import Transaction, unwrap
from .contract import BesideConnection, Capabilities, Driver

T = TypeVar("T")

__all__ = ["PostgresDriver", "migrate", "open_postgres_driver"]


class _FireTaken(JobsError):
    """A fire of this task and scheduled time is already on record: roll the advance back.
    A JobsError so the bridge hands it through as it is."""


# How often wait_for_work looks while the LISTEN connection is down (it cannot be woken then).
DEAF_POLL = 1.0


@contextlib.asynccontextmanager
async def open_postgres_driver(
    url: str,
    *,
    clock: Callable[[], float] = time.time,
    schema: str = "jobs_trio",
    migrate: bool = False,
    pool_size: int = 10,
    loop: Any = None,
    drop_schema_on_close: bool = False,
    statement_timeout: float | None = None,
    lock_timeout: float | None = None,
    pgbouncer: str | None = None,
    listen_url: str | None = None,
) -> AsyncIterator[PostgresDriver]:
    """A driver on ``schema`` for as long as the block runs.

    ``migrate=True`` applies pending migrations first (else an unmigrated schema is refused
    with the fix). ``loop`` is a trio-asyncio loop to run on; by default the one the caller
    already runs in, else one the driver opens for its own lifetime. ``pool_size`` bounds the
    connections operations use at once; the LISTEN connection is one more. An application's
    own connection passed as ``connection=`` must live on the same loop (``driver.loop``).
    ``statement_timeout`` and ``lock_timeout`` (seconds; else the URL's
    ``?statement_timeout=30s&lock_timeout=2s``, else those defaults; 0 turns one off) bound every
    statement the driver's own connections run. ``pgbouncer`` ("session" or "transaction"; else
    the URL's ``?pgbouncer=``) says PgBouncer stands in between, and ``listen_url`` (else the URL's
    ``?listen_host=&listen_port=``) where LISTEN connects directly (_postgres_pooler.py,
    docs/drivers.md). ``drop_schema_on_close`` is for tests."""
    statements = load_statements(schema)
    session = session_settings(url, statement_timeout=statement_timeout, lock_timeout=lock_timeout)
    pooler = Pooler.of(url, pgbouncer, listen_url)
    with sole_error():
        async with (
            open_bridge(
                url,
                loop=loop,
                pool_size=pool_size,
                application_name=f"jobs_trio:{schema}",
                session=session,
                pooler=pooler,
                name_holders=holders_namer(statements),
            ) as bridge,
            _open_on(bridge, statements, clock, migrate, drop_schema_on_close) as driver,
        ):
            yield driver


@contextlib.asynccontextmanager
async def _open_on(
    bridge: Bridge,
    statements: Statements,
    clock: Callable[[], float],
    migrate: bool,
    drop_schema_on_close: bool,
) -> AsyncIterator[PostgresDriver]:
    """The driver proper, on an open bridge: schema checked (or migrated), the LISTEN
    connection made (it LISTENs once something waits for work: Listener.listen)."""
    if migrate:
        await apply_migrations(bridge, statements)
    else:
        await check_migrated(bridge, statements)
    listener = Listener(bridge, statements.channel)
    driver = PostgresDriver(bridge.url, bridge, statements, listener, clock)
    try:
        async with trio.open_nursery() as nursery:
            if bridge.pooler.listen_url is not None:
                await nursery.start(listener.run)
            else:
                # PgBouncer in transaction mode and no direct connection: no LISTEN can hold,
                # so wait_for_work polls (DEAF_POLL) while `listening` stays False.
                listener.deaf()
            try:
                yield driver
            finally:
                driver._closed = True
                nursery.cancel_scope.cancel()
    finally:
        if drop_schema_on_close:
            await driver._drop_schema()


class PostgresDriver:
    """Jobs in PostgreSQL. Open it with :func:`open_postgres_driver`; every method crosses into
    asyncpg once (a batch of claims is one statement, a batch of settlements one transaction)."""

    # Every capability of the contract (Capabilities): the conformance suite tests each.
    capabilities = Capabilities(
        settles_with_claims=True,
        claims_ahead=True,
        rescue_on_request=True,
        renews_beside=True,
        hands_back_unheld=True,
        claims_side_by_side=True,
    )

    def __init__(
        self,
        url: str,
        bridge: Bridge,
        statements: Statements,
        listener: Listener,
        clock: Callable[[], float],
    ) -> None:
        self.url = url
        self.bridge = bridge
        self.schema = statements.schema
        self._sql = statements
        self._listener = listener
        self._clock = clock
        self._closed = False
        self._outbox_source: str | None = None  # read once: a migration made it
        # Drivers found to be on this driver's database (shares_outbox): a database never moves.
        self._shares_with: weakref.WeakSet[PostgresDriver] = weakref.WeakSet()

    @property
    def loop(self) -> Any:
        """The trio-asyncio loop the driver's connections live on: an application's own
        connection passed as ``connection=`` must have been opened on it."""
        return self.bridge.loop

    @property
    def listening(self) -> bool:
        """Whether the driver LISTENs: from the first wait_for_work on, while its connection is
        up (before, nothing needs waking; while down, wait_for_work polls on its timeout)."""
        return self._listener.connected

    def now(self) -> float:
        return self._clock()

    def _check_open(self) -> None:
        if self._closed:
            raise driver_closed("PostgreSQL")

    async def _run_here_or_on(
        self, connection: object | None, op: Callable[[Connection], Any], *, what: str
    ) -> Any:
        conn, tx = unwrap(connection)  # a jobs_trio.transaction(): its asyncpg connection
        if conn is None:
            return await self.bridge.run(op, what=what)
        if tx is None:
            return await self.bridge.run_on(conn, op, what=what)
        async with tx.lock:  # one statement at a time on the block's connection
            return await self.bridge.run_on(conn, op, what=what)

    # --- the application's transaction ---

    @contextlib.asynccontextmanager
    async def open_transaction(self) -> AsyncIterator[Transaction]:
        """A transaction on a connection of this driver's pool, for
        ``jobs_trio.transaction(driver)``: the application's SQL (``tx.execute``/``fetch``/
        ``fetchrow``/``fetchval``) and the jobs and events it enqueues commit together. Up to
        ``pool_size - 1`` blocks hold a connection at once (more wait for one): the driver's
        own operations always find the last."""
        self._check_open()
        async with open_pooled_transaction(self.bridge) as tx:
            yield tx

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

    async def claim(
        self,
        queues: Sequence[str],
        limit: int | Mapping[str, int],
        *,
        lease: float,
        worker_id: str,
        free: Mapping[str, int] | None = None,
        rescue: bool = True,
    ) -> Sequence[Claim]:
        self._check_open()
        slots = ClaimSlots.of(queues, limit)
        if not slots.caps:
            await trio.lowlevel.checkpoint()
            return []
        now = self.now()
        sql = self._sql

        async def take(conn: Connection) -> list[Any]:
            # One statement: the claim and the burial of exhausted lapsed jobs commit together.
            return list(
                await conn.fetch(
                    sql["claim"], *_claim_arguments(now, slots, lease, worker_id, free, rescue)
                )
            )

        rows = await self.bridge.run(take, what="claim")
        return await self._claims(rows, now, float(lease), worker_id)

    async def settle_and_claim(
        self,
        settlements: Sequence[Settlement],
        queues: Sequence[str],
        limit: int | Mapping[str, int],
        *,
        lease: float,
        worker_id: str,
        free: Mapping[str, int] | None = None,
        rescue: bool = True,
    ) -> tuple[Sequence[JobId], Sequence[Claim]]:
        self._check_open()
        slots = ClaimSlots.of(queues, limit)
        firsts = _first_per_claim(settlements)
        if not firsts:
            claims = await self.claim(
                queues, limit, lease=lease, worker_id=worker_id, free=free, rescue=rescue
            )
            return [], claims
        if not slots.caps:
            return await self.settle(settlements), []
        now = self.now()
        sql = self._sql
        by_kind = _by_kind(firsts)
        claiming = _claim_arguments(now, slots, lease, worker_id, free, rescue)

        async def both(conn: Connection) -> tuple[set[tuple[JobId, str]], list[Any], bool]:
            if len(by_kind) > 1:
                # Several kinds (rare): the settles' statements, then the claim's, in one
                # transaction (run below with transaction=True); the claim's own snapshot
                # sees what the settles changed, a waiter they woke included.
                # Every row locked first (waiting): none is ever skipped as busy here.
                applied, _ = await _apply_settles(conn, sql, now, firsts, by_kind)
                return applied, list(await conn.fetch(sql["claim"], *claiming)), False
            # The usual batch, one kind: ONE statement settles and claims, one round trip.
            [(kind, group)] = by_kind.items()
            rows = await conn.fetch(
                sql[f"settle_claim_{kind}"], *claiming, sql.channel, *_settle_columns(group)
            )
            applied = {(row["id"], row["token"]) for row in rows if not row["claimed"]}
            claimed = sorted(
                (row for row in rows if row["claimed"]),
                key=lambda row: (row["priority"], row["run_at"], row["id"]),
            )
            # One snapshot: a job the settle made due now was not this claim's to see.
            made_due = any(row["made_due"] for row in rows if not row["claimed"])
            return applied, claimed, made_due

        applied, rows, made_due = await self.bridge.run(
            both, what="settle and claim", transaction=len(by_kind) > 1
        )
        claims = await self._claims(rows, now, float(lease), worker_id)
        if made_due:
            claims += await self._claim_made_due(
                limit, slots, claims, lease, worker_id, free, rescue
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
    ) -> list[Claim]:
        """After settle_and_claim's statement made jobs due now (a retry or suspension without
        delay, a freed fleet slot's waiter): the free capacity it left, claimed as settle() then
        claim() would have (the statement's one snapshot could not see them). The settles
        committed already, so a failure here costs only this claim (those jobs stay due, for
        the next), never the settles: the caller would write them again, and read them as
        fenced."""
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
                    queues, rest, lease=lease, worker_id=worker_id, free=still_free, rescue=rescue
                )
            )
        except JobsError as exc:
            log_event(
                "jobs.driver.made-due-claim-failed", logging.WARNING, queues=queues, error=str(exc)
            )
            return []

    async def _claims(
        self, rows: Sequence[Any], now: float, lease: float, worker_id: str
    ) -> list[Claim]:
        """The claim statement's rows as claims, in its order. A NULL token is a candidate with
        fleet limits, left for a transaction of its own (_claim_limited); the rest committed
        already, so a failure there costs only the limited ones their turn (they stay ready,
        untouched), never the claims already made (they would sit claimed till their lease
        lapsed, each an attempt spent)."""
        limited = [row["id"] for row in rows if row["token"] is None]
        granted = {}
        if limited:
            try:
                granted = await self._claim_limited(limited, now, lease, worker_id)
            except JobsError as exc:
                log_event(
                    "jobs.driver.limited-claim-failed",
                    logging.WARNING,
                    jobs=len(limited),
                    error=str(exc),
                )
        return [
            Claim(
                job_id=row["id"],
                token=row["token"],
                name=row["name"],
                queue=row["queue"],
                payload=row["payload"],
                attempt=row["attempts"],
                max_attempts=row["max_attempts"],
                lease_until=row["lease_until"],
                context=row["context"],
                ahead=row["ahead"],
                due_at=row["run_at"],
            )
            for row in (granted.get(r["id"]) if r["token"] is None else r for r in rows)
            if row is not None
        ]

    async def _claim_limited(
        self, ids: Sequence[JobId], now: float, lease: float, worker_id: str
    ) -> dict[JobId, Any]:
        """Claim what the fleet limits allow of ``ids`` (claim order) and put the rest off, in
        one transaction: the jobs and their limit rows locked SKIP LOCKED (a claim never waits,
        so it never deadlocks with another, a renew or a settle), then the shared rule
        (_limit_rules.py) decides and one statement writes it all. Answers the granted rows."""
        sql = self._sql

        async def take(conn: Connection) -> dict[JobId, Any]:
            jobs = await conn.fetch(sql["claim_limited_jobs"], now, list(ids))
            candidates = [
                (
                    row["id"],
                    JobLimits(
                        row["slot_key"],
                        row["slots"] or 0,
                        row["rate_key"],
                        row["starts"] or 0,
                        row["per"] or 0.0,
                    ),
                )
                for row in jobs
            ]
            wanted = sorted({need for _, limits in candidates for need in needs(limits)})
            if not wanted:
                return {}
            kinds, keys, counts = ([w[i] for w in wanted] for i in range(3))
            await conn.execute(sql["limit_rows_create"], kinds, keys, counts)
            rows: dict[tuple[str, str], list[LimitRow]] = {}
            for row in await conn.fetch(sql["claim_limited_rows"], kinds, keys):
                rows.setdefault((row["kind"], row["key"]), []).append(LimitRow(*row))
            decision = decide(candidates, rows, now=now, lease=lease, missing_is_free=False)
            put_off = list(decision.put_off.items())
            # The taken rows' columns as unnest arrays: kind, key, n, until, token, job_id.
            rows_taken = map(attrs.astuple, decision.taken)
            taken = [list(column) for column in zip(*rows_taken, strict=True)]
            claimed = await conn.fetch(
                sql["claim_limited_take"],
                *(taken or [[]] * 6),
                now,
                [job_id for job_id, _ in put_off],
                [run_at for _, (run_at, _) in put_off],
                [waits for _, (_, waits) in put_off],
                LAPSED_ERROR,
                lease,
                worker_id,
                list(decision.granted),
                list(decision.granted.values()),
            )
            return {row["id"]: row for row in claimed}

        granted: dict[JobId, Any] = await self.bridge.run(
            take, what="claim (fleet limits)", transaction=True
        )
        return granted

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

    async def settle(self, settlements: Sequence[Settlement]) -> Sequence[JobId]:
        self._check_open()
        firsts = _first_per_claim(settlements)
        if not firsts:
            await trio.lowlevel.checkpoint()
            return []
        by_kind = _by_kind(firsts)
        apply = _settlement(self._sql, self.now(), firsts, by_kind)
        # One kind (the usual batch: N completes) is one statement; several kinds are one
        # transaction, so a batch never half-applies.
        applied, busy = await self.bridge.run(apply, what="settle", transaction=len(by_kind) > 1)
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

    # --- operators ---

    async def get(self, job_id: JobId) -> JobRecord | None:
        self._check_open()
        sql = self._sql

        async def read(conn: Connection) -> Any:
            return await conn.fetchrow(sql["get_job"], job_id)

        row = await self.bridge.run(read, what="get")
        return None if row is None else job_record(row)

    async def list_jobs(
        self,
        *,
        state: JobState | None = None,
        queue: str | None = None,
        name: str | None = None,
        changed_before: float | None = None,
        limit: int = 100,
    ) -> Sequence[JobRecord]:
        self._check_open()
        sql = self._sql
        state_value = None if state is None else JobState(state).value
        before = None if changed_before is None else float(changed_before)

        async def read(conn: Connection) -> list[Any]:
            return list(
                await conn.fetch(sql["list_jobs"], state_value, queue, max(limit, 0), name, before)
            )

        return [job_record(row) for row in await self.bridge.run(read, what="list")]

    async def retry(self, job_id: JobId) -> JobRecord:
        self._check_open()
        now = self.now()
        sql = self._sql

        async def rerun(conn: Connection) -> Any:
            record = _record_or_raise(await conn.fetchrow(sql["lock_job"], job_id), job_id)
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

        return job_record(await self.bridge.run(rerun, what="retry", transaction=True))

    async def cancel(self, job_id: JobId) -> JobRecord:
        self._check_open()
        now = self.now()
        sql = self._sql

        async def stop(conn: Connection) -> Any:
            record = _record_or_raise(await conn.fetchrow(sql["lock_job"], job_id), job_id)
            if cancel_flags_only(record):
                return await conn.fetchrow(sql["request_cancel"], now, job_id)
            return await conn.fetchrow(sql["cancel_job"], now, job_id, OPERATOR_CANCEL_ERROR)

        return job_record(await self.bridge.run(stop, what="cancel", transaction=True))

    async def delete(self, job_id: JobId) -> JobRecord:
        self._check_open()
        sql = self._sql

        async def remove(conn: Connection) -> JobRecord:
            record = _record_or_raise(await conn.fetchrow(sql["lock_job"], job_id), job_id)
            check_delete(record)
            await conn.execute(sql["delete_job"], job_id)
            return record

        deleted: JobRecord = await self.bridge.run(remove, what="delete", transaction=True)
        return deleted

    async def run_now(self, job_id: JobId) -> JobRecord:
        self._check_open()
        now = self.now()
        sql = self._sql

        async def hurry(conn: Connection) -> JobRecord:
            record = _record_or_raise(await conn.fetchrow(sql["lock_job"], job_id), job_id)
            check_run_now(record)
            if record.run_at <= now:
                return record
            updated = job_record(await conn.fetchrow(sql["run_now"], now, job_id))
            await conn.execute(sql["notify"], sql.channel, [record.queue])
            return updated

        hurried: JobRecord = await self.bridge.run(hurry, what="run now", transaction=True)
        return hurried

    async def pause_queue(self, queue: str, *, by: str | None = None) -> QueuePause:
        self._check_open()
        now = self.now()
        sql = self._sql

        async def pause(conn: Connection) -> QueuePause:
            await conn.execute(sql["pause_lock"])
            row = await conn.fetchrow(
                sql["pause_queue"], queue, now, by, sql.channel, PAUSES_CHANGED
            )
            return QueuePause(*row)

        paused: QueuePause = await self.bridge.run(pause, what="pause", transaction=True)
        return paused

    async def resume_queue(self, queue: str) -> bool:
        self._check_open()
        sql = self._sql

        async def resume(conn: Connection) -> bool:
            row = await conn.fetchrow(sql["resume_queue"], queue, sql.channel, PAUSES_CHANGED)
            return bool(row["resumed"])

        resumed: bool = await self.bridge.run(resume, what="resume")
        return resumed

    async def queue_pauses(self) -> Sequence[QueuePause]:
        self._check_open()
        sql = self._sql

        async def read(conn: Connection) -> list[QueuePause]:
            return [QueuePause(*row) for row in await conn.fetch(sql["paused_queues"])]

        pauses: list[QueuePause] = await self.bridge.run(read, what="queue pauses")
        return pauses

    async def _pause_look(self) -> PauseLook:
        sql = self._sql

        async def read(conn: Connection) -> PauseLook:
            rows = await conn.fetch(sql["pause_look"])
            return PauseLook(
                rows[0]["epoch"],
                tuple(QueuePause(*row[1:]) for row in rows if row["queue"] is not None),
            )

        look: PauseLook = await self.bridge.run(read, what="queue pauses")
        return look

    async def wait_for_pauses(self, seen: int | None, timeout: float) -> PauseLook:
        self._check_open()
        with self._listener.waiting([PAUSES_CHANGED]) as woken:
            # LISTEN before the look, as wait_for_work does: a pause committed after the look
            # notifies this waiter, one committed before it is seen by it.
            await self._listener.listen()
            look = await self._pause_look()
            if look.epoch != seen:
                return look
            if not self._listener.connected:
                timeout = min(timeout, DEAF_POLL)  # deaf: poll until LISTEN is back
            with trio.move_on_after(timeout):
                await woken.wait()
        return await self._pause_look()

    async def pauses_heard(self, worker_id: str, epoch: int) -> None:
        self._check_open()
        now = self.now()
        sql = self._sql

        async def write(conn: Connection) -> None:
            await conn.execute(
                sql["pauses_heard"], worker_id, epoch, now, now - FORGET_WORKERS_AFTER
            )

        await self.bridge.run(write, what="pauses heard")

    async def pause_holders(self, queue: str) -> Sequence[PauseHolder]:
        self._check_open()
        sql = self._sql

        async def read(conn: Connection) -> list[PauseHolder]:
            return [PauseHolder(*row) for row in await conn.fetch(sql["pause_holders"], queue)]

        holders: list[PauseHolder] = await self.bridge.run(read, what="pause holders")
        return holders

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
            deleted = len(
                await conn.fetch(sql["prune_batch"], finished_before, dead_before, turn.limit)
            )
            more = deleted >= turn.limit
            if more:
                await conn.execute(sql["prune_turn_hold"], turn.holder, now + turn.hold)
            else:
                await conn.execute(sql["prune_turn_end"], now)
            return Pruned(turn=True, deleted=deleted, more=more)

        pruned: Pruned = await self.bridge.run(batch, what="prune", transaction=True)
        return pruned

    # --- wake-ups ---

    async def wait_for_work(
        self, queues: Sequence[str], timeout: float, *, rescue_from: float | None = None
    ) -> None:
        self._check_open()
        with self._listener.waiting(queues) as woken:
            # LISTEN (the first time) before the look: an enqueue committed after the look then
            # notifies us, and one committed before it is seen by it.
            await self._listener.listen()
            try:
                due_in = await self._next_due_in(queues, rescue_from)
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

    async def _next_due_in(self, queues: Sequence[str], rescue_from: float | None = None) -> float:
        if not queues:
            await trio.lowlevel.checkpoint()
            return math.inf
        sql = self._sql
        lapses_from = -math.inf if rescue_from is None else rescue_from

        async def read(conn: Connection) -> float | None:
            value: float | None = await conn.fetchval(sql["next_due"], list(queues), lapses_from)
            return value

        soonest = await self.bridge.run(read, what="wait_for_work")
        return math.inf if soonest is None else soonest - self.now()

    # --- steps and events ---

    async def load_steps(self, job_id: JobId) -> Sequence[StepRecord]:
        self._check_open()
        sql = self._sql

        async def read(conn: Connection) -> list[Any]:
            return list(await conn.fetch(sql["load_steps"], job_id))

        return [
            StepRecord(
                name=row["name"],
                status=StepStatus(row["status"]),
                started_at=row["started_at"],
                finished_at=row["finished_at"],
                result=row["result"],
                wake_at=row["wake_at"],
                event=row["event"],
                match=row["match_key"],
            )
            for row in await self.bridge.run(read, what="load_steps")
        ]

    async def save_step(
        self, lease: Lease, step: StepRecord, *, connection: object | None = None
    ) -> bool:
        self._check_open()
        sql = self._sql

        async def write(conn: Connection) -> Any:
            return await conn.fetchval(
                sql["save_step"],
                lease.job_id,
                lease.token,
                step.name,
                StepStatus(step.status).value,
                step.started_at,
                step.finished_at,
                step.result,
                step.wake_at,
                step.event,
                step.match,
            )

        # In the caller's transaction (step.transaction), the row lock the statement takes
        # (FOR KEY SHARE) is held until that transaction ends: a claim (FOR UPDATE SKIP LOCKED)
        # skips the job until the step's effects and its record have committed together.
        return await self._run_here_or_on(connection, write, what="save_step") is not None

    async def send_event(
        self, name: str, payload: str, *, key: str | None = None, connection: object | None = None
    ) -> str:
        self._check_open()
        json.loads(payload)  # the boundary checked it; a driver never stores what it cannot read
        now = self.now()
        sql = self._sql

        async def write(conn: Connection) -> str:
            event_id: str = await run_plan_async(
                event_plan(sql, now, name, payload, key), functools.partial(fetch_on, conn)
            )
            return event_id

        event_id: str = await self._run_here_or_on(connection, write, what="send_event")
        return event_id

    async def look_for_event(self, name: str, *, key: str | None, since: float | None) -> EventLook:
        self._check_open()
        sql = self._sql

        async def read(conn: Connection) -> Any:
            return await conn.fetchrow(sql["look_for_event"], name, key, since)

        row = await self.bridge.run(read, what="look_for_event")
        seen: str = row["seen"]  # the look's snapshot (rules.woken)
        if row["id"] is None:
            return EventLook(None, seen)
        found = EventRecord(
            id=str(row["id"]),
            name=row["name"],
            key=row["key"],
            payload=row["payload"],
            created_at=row["created_at"],
        )
        return EventLook(found, seen)

    # --- cron tasks ---

    async def task_marks(self) -> Sequence[TaskMark]:
        self._check_open()
        sql = self._sql

        async def read(conn: Connection) -> list[Any]:
            return list(await conn.fetch(sql["task_marks"]))

        return [TaskMark(*row) for row in await self.bridge.run(read, what="task_marks")]

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

    # --- attempt history and worker presence (what the dashboard shows) ---

    async def load_attempts(self, job_id: JobId) -> Sequence[AttemptRecord]:
        self._check_open()
        sql = self._sql

        async def read(conn: Connection) -> list[Any]:
            return list(await conn.fetch(sql["load_attempts"], job_id))

        rows = await self.bridge.run(read, what="load_attempts")
        return [AttemptRecord(**dict(row)) for row in rows]

    async def outcome_counts(self, since: float, bucket: float) -> Sequence[OutcomeCount]:
        self._check_open()
        sql = self._sql

        async def read(conn: Connection) -> list[Any]:
            return list(await conn.fetch(sql["outcome_counts"], since, float(bucket)))

        rows = await self.bridge.run(read, what="outcome_counts")
        return [OutcomeCount(row["start"], row["outcome"], row["n"]) for row in rows]

    async def name_stats(self, since: float) -> Sequence[NameStats]:
        self._check_open()
        sql = self._sql

        async def read(conn: Connection) -> list[Any]:
            return list(await conn.fetch(sql["name_stats"], since))

        return name_stats(tuple(row) for row in await self.bridge.run(read, what="name stats"))

    async def worker_seen(self, presence: WorkerPresence) -> None:
        self._check_open()
        sql = self._sql
        forget_before = self.now() - FORGET_WORKERS_AFTER
        p = presence

        async def write(conn: Connection) -> None:
            await conn.execute(
                sql["worker_seen"],
                p.worker_id,
                p.host,
                p.pid,
                json.dumps(p.queues),
                p.concurrency,
                p.running,
                p.state,
                p.version,
                p.started_at,
                p.seen_at,
                p.every,
                forget_before,
                encode_jobs(p.jobs),
            )

        await self.bridge.run(write, what="worker_seen")

    async def worker_gone(self, worker_id: str) -> None:
        self._check_open()
        sql = self._sql

        async def delete(conn: Connection) -> None:
            await conn.execute(sql["worker_gone"], worker_id)

        await self.bridge.run(delete, what="worker_gone")

    async def workers(self) -> Sequence[WorkerPresence]:
        self._check_open()
        sql = self._sql

        async def read(conn: Connection) -> list[Any]:
            return list(await conn.fetch(sql["workers"]))

        rows = await self.bridge.run(read, what="workers")
        return [
            WorkerPresence(
                **{
                    **dict(row),
                    "queues": tuple(json.loads(row["queues"])),
                    "jobs": decode_jobs(row["jobs"]),
                }
            )
            for row in rows
        ]

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
        self._check_open()
        sql = self._sql

        async def read(conn: Connection) -> set[JobId]:
            return {row["id"] for row in await conn.fetch(sql["outbox_present"], list(job_ids))}

        there = await self.bridge.run(read, what="outbox present")
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

    async def relay_enqueue(
        self,
        jobs: Sequence[NewJob],
        *,
        source: str,
        ticket: str,
        superseded: Sequence[str] = (),
    ) -> Sequence[RelayDecision]:
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
        self._check_open()
        sql = self._sql

        async def delete(conn: Connection) -> int:
            gone: int = await conn.fetchval(sql["relay_forget"], source, list(job_ids))
            return gone

        gone: int = await self.bridge.run(delete, what="relay forget")
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
        if outbox is self:
            await trio.lowlevel.checkpoint()
            return True
        if not isinstance(outbox, PostgresDriver):
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
        self._check_open()
        sql = self._sql

        async def write(conn: Connection) -> None:
            await conn.execute(sql["outbox_probe_write"], probe)

        await self.bridge.run(write, what="outbox probe")

    async def relay_in_place(self, outbox: Driver, limit: int) -> Sequence[RelayDecision]:
        self._check_open()
        if not isinstance(outbox, PostgresDriver) or not await self.shares_outbox(outbox):
            raise refuse_in_place("PostgreSQL")
        sql, there = self._sql, outbox._sql
        now = self.now()

        async def move(conn: Connection) -> list[RelayDecision]:
            # One transaction on one connection: the rows stay locked (FOR UPDATE) until the
            # commit that writes their jobs and deletes them, or the rollback that leaves them.
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

    async def aclose(self) -> None:
        """Stop answering; the connections close when the ``async with`` that opened the
        driver ends (they belong to its scope, not to this call)."""
        self._closed = True
        self._listener.wake(None)
        await trio.lowlevel.checkpoint()

    async def _drop_schema(self) -> None:
        sql = self._sql

        async def drop(conn: Connection) -> None:
            await conn.execute(sql["drop_schema"])

        with trio.CancelScope(shield=True), trio.move_on_after(10):
            await self.bridge.run(drop, what=f"dropping schema {self.schema!r}", bounded=False)


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
        created = {
            row["id"]
            for row in await conn.fetch(
                sql["enqueue_once"],
                now,
                *job_columns(pending),
                sql.channel,
                *limit_columns(pending),
            )
        }
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


def _claim_arguments(
    now: float,
    slots: ClaimSlots,
    lease: float,
    worker_id: str,
    free: Mapping[str, int] | None,
    rescue: bool,
) -> tuple[Any, ...]:
    """The claim statement's parameters, $1 to $10 (settle_claim_<kind> takes them first too).
    With no ``free`` given, every claim has a slot: none is marked ahead."""
    caps = list(slots.caps.values())
    return (
        now,
        list(slots.caps),
        slots.total,
        float(lease),
        worker_id,
        LAPSED_ERROR,
        LAPSED_OUT_OF_ATTEMPTS,
        caps,
        caps if free is None else [free.get(q, 0) for q in slots.caps],
        now if rescue else -math.inf,
    )


def _first_per_claim(settlements: Sequence[Settlement]) -> dict[tuple[JobId, str], Settlement]:
    """One settlement per claim: a second for the same lease in the batch would find the
    token already cleared by the first, which is what applying them in order means."""
    firsts: dict[tuple[JobId, str], Settlement] = {}
    for s in settlements:
        firsts.setdefault((s.lease.job_id, s.lease.token), s)
    return firsts


def _by_kind(firsts: Mapping[tuple[JobId, str], Settlement]) -> dict[str, list[Settlement]]:
    by_kind: dict[str, list[Settlement]] = {}
    for s in firsts.values():
        by_kind.setdefault(kind_of(s).name, []).append(s)
    return by_kind


def _renewal(
    sql: Statements,
    now: float,
    leases: Sequence[Lease],
    lease: float,
    started: Sequence[ClaimToken],
) -> Callable[[Connection], Awaitable[list[Any]]]:
    """Driver.renew's one statement, as an operation on a connection."""

    async def extend(conn: Connection) -> list[Any]:
        return list(
            await conn.fetch(
                sql["renew"],
                now,
                float(lease),
                [one.job_id for one in leases],
                [one.token for one in leases],
                list(started),
            )
        )

    return extend


def _renewed(rows: Sequence[Any]) -> RenewResult:
    return RenewResult(
        held=frozenset(row["token"] for row in rows if not row["busy"]),
        cancel_requested=frozenset(row["token"] for row in rows if row["cancel_requested"]),
        slot_lost=frozenset(row["token"] for row in rows if row["slot_lost"]),
        busy=frozenset(row["token"] for row in rows if row["busy"]),
    )


def _settlement(
    sql: Statements,
    now: float,
    firsts: Mapping[tuple[JobId, str], Settlement],
    by_kind: Mapping[str, Sequence[Settlement]],
) -> Callable[[Connection], Awaitable[tuple[set[tuple[JobId, str]], set[JobId]]]]:
    """Driver.settle's statements, as an operation on a connection."""

    async def apply(conn: Connection) -> tuple[set[tuple[JobId, str]], set[JobId]]:
        return await _apply_settles(conn, sql, now, firsts, by_kind)

    return apply


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
        firsts = _first_per_claim(settlements)
        by_kind = _by_kind(firsts)
        apply = _settlement(self._sql, self._clock(), firsts, by_kind)

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


async def _apply_settles(
    conn: Connection,
    sql: Statements,
    now: float,
    firsts: Mapping[tuple[JobId, str], Settlement],
    by_kind: Mapping[str, Sequence[Settlement]],
) -> tuple[set[tuple[JobId, str]], set[JobId]]:
    """Each kind's statement; answers what applied, and the job ids of the rows skipped for a
    lock another session holds (only a single kind's statement skips any: several kinds lock
    every row first, waiting at most the lock timeout)."""
    if len(by_kind) > 1:
        await conn.execute(sql["lock_for_settle"], sorted({i for i, _ in firsts}))
    applied: set[tuple[JobId, str]] = set()
    busy: set[JobId] = set()
    for kind, group in by_kind.items():
        rows = await conn.fetch(sql[f"settle_{kind}"], now, sql.channel, *_settle_columns(group))
        applied.update((row["id"], row["token"]) for row in rows if not row["busy"])
        skipped = {row["id"] for row in rows if row["busy"]}
        if not skipped:
            continue
        # Most skipped rows are a moment's lock: a concurrent claim whose snapshot still read
        # the row as ready locks it on its way to finding it taken, until that claim commits.
        # Written again waiting (at most the lock timeout), the rest of the batch committed
        # already: only a lock that outlasts the timeout is left busy.
        again = [s for s in group if s.lease.job_id in skipped]
        try:
            rows = await conn.fetch(
                sql[f"settle_wait_{kind}"], now, sql.channel, *_settle_columns(again)
            )
        except Exception as exc:
            if getattr(exc, "sqlstate", None) not in ROW_LOCK_STATES:
                raise
            busy.update(skipped)
            continue
        applied.update((row["id"], row["token"]) for row in rows)
    return applied, busy


def _applied_in_order(
    settlements: Sequence[Settlement], applied: set[tuple[JobId, str]]
) -> list[JobId]:
    """In the caller's order, each id once, as the memory driver answers: placed by the
    settlement that applied (by its token), not by a stale one of the same job before it."""
    return list(
        dict.fromkeys(
            s.lease.job_id for s in settlements if (s.lease.job_id, s.lease.token) in applied
        )
    )


def _settle_columns(group: Sequence[Settlement]) -> list[list[Any]]:
    """The unnest arrays for one kind's statement (every settlement in ``group`` is of that
    kind), in its parameter order after ``now`` and the channel: ids, tokens, whether each hands
    its attempt back, the delay (a kind that moves run_at), each field the kind writes (in the
    order rules.SETTLEMENT_KINDS names them), what each becomes under a pending cancel (a
    kind that would leave the job live: the SQL picks it by the row's flag), and its look's
    mark (a kind that reads events)."""
    if type(group[0]) is Complete:
        return _complete_columns(cast("Sequence[Complete]", group))
    effects = [effect(s) for s in group]
    columns: list[list[Any]] = [
        [s.lease.job_id for s in group],
        [s.lease.token for s in group],
        [e.hands_back for e in effects],
    ]
    if kind_of(group[0]).moves_run_at:
        # None where the run_at stays (an interrupted attempt keeps its place in line).
        columns.append([None if e.delay is None else float(e.delay) for e in effects])
    columns += [[e.writes[field] for e in effects] for field in effects[0].writes]
    cancelled = [instead.error for s in group if (instead := cancel_instead(s)) is not None]
    if cancelled:
        columns.append(cancelled)
    if kind_of(group[0]).reads_events:
        # The SQL makes the job ready now when an event is stored past the mark (rules.woken).
        columns.append([None if e.unseen is None else e.unseen.mark for e in effects])
    # Last, the attempt notes (postgres_sql.NOTE_TYPES): NULL where a settlement has none.
    notes = [s.note for s in group]
    columns += [
        [None if n is None else n.attempt for n in notes],
        [history_outcome(s) for s in group],
        [None if n is None else n.worker_id for n in notes],
        [None if n is None else n.seconds for n in notes],
        [None if n is None else n.traceback for n in notes],
    ]
    return columns


def _complete_columns(group: Sequence[Complete]) -> list[list[Any]]:
    """``_settle_columns`` for a batch of completions, the most common by far, in one pass and
    with no Effect made per settlement (a sixth of the driver's share of a no-op job, issue
    44): ids, tokens, none hands its attempt back, the results; no cancel instead (a completion
    stands), no look; then the notes."""
    ids, tokens, results = [], [], []
    attempts: list[int | None] = []
    workers: list[str | None] = []
    seconds: list[float | None] = []
    tracebacks: list[str | None] = []
    for s in group:
        lease, note = s.lease, s.note
        ids.append(lease.job_id)
        tokens.append(lease.token)
        results.append(s.result)
        if note is None:
            attempts.append(None)
            workers.append(None)
            seconds.append(None)
            tracebacks.append(None)
        else:
            attempts.append(note.attempt)
            workers.append(note.worker_id)
            seconds.append(note.seconds)
            tracebacks.append(note.traceback)
    n = len(ids)
    return [
        ids,
        tokens,
        [False] * n,
        results,
        attempts,
        ["completed"] * n,
        workers,
        seconds,
        tracebacks,
    ]


# From this many unkeyed jobs an enqueue writes them by COPY: 20,000 jobs went in at 71,000 a
# second by COPY against 50,000 by INSERT ... unnest, and the client's encoding from 5 us a job
# to 1 (/tmp-style A/B on this machine, plain asyncpg). Below it, the statement is cheaper.
COPY_AT_LEAST = 64
_COPY_COLUMNS = (
    "id", "name", "queue", "state", "payload", "priority", "attempts", "max_attempts",
    "run_at", "created_at", "updated_at", "slot_key", "slots", "rate_key", "starts", "per",
    "context",
)  # fmt: skip


def _copy_row(job: NewJob, now: float) -> tuple[Any, ...]:
    """One COPY row, in _COPY_COLUMNS' order."""
    limits = limit_fields(job.limits)
    return (
        job.job_id,
        job.name,
        job.queue,
        "ready",
        job.payload,
        job.priority,
        0,
        job.max_attempts,
        now + max(float(job.delay), 0.0),
        now,
        now,
        limits["slot_key"],
        limits["slots"],
        limits["rate_key"],
        limits["starts"],
        limits["per"],
        job.context,
    )


async def _copy_in(conn: Connection, sql: Statements, now: float, batch: Sequence[NewJob]) -> None:
    """Write ``batch`` (no job of it keyed) by COPY, then notify its queues: as ``enqueue``
    does, row for row (run_at now + the delay, its fleet limits' columns)."""
    records = [_copy_row(job, now) for job in batch]
    await conn.copy_records_to_table(
        "jobs", schema_name=sql.schema, columns=_COPY_COLUMNS, records=records
    )
    await conn.execute(sql["notify"], sql.channel, sorted({job.queue for job in batch}))


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
