# The SQLite driver's jobs: enqueue, claim (fleet limits, claims ahead), renew, settle, wake-ups.
# Apart because it is the path every job takes; the other capabilities only read or nudge it.
from __future__ import annotations

import json
import math
import operator
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import attrs
import trio

from ..._core.errors import DriverError
from ..._core.records import (
    WAITING_STATES,
    Claim,
    ClaimToken,
    Enqueued,
    JobId,
    JobLimits,
    Lease,
    NewJob,
    RenewResult,
    Settlement,
)
from .._calls import ClaimAsk, ClaimCalls
from .._claim_slots import ClaimSlots
from .._limit_rules import LimitRow, decide, needs
from .._rows import JOB_COLUMNS, job_record
from .._rules import (
    ATTEMPT_HISTORY,
    LAPSED_ERROR,
    SUSPECT_AT,
    hands_back_lapse,
    log_orphaned,
    orphaned_record,
    orphaning,
)
from .._sqlite_door import Work
from .._sqlite_enqueue import insert_jobs
from .._sqlite_migrate import open_beside
from .._transaction import unwrap
from ..contract import BesideConnection
from ._connection import SqliteConnection, T, _paused, data_version
from ._settle_statements import _INSERT_HISTORY, _attempt_values, _settle_all

# What a claim reads back of each job it took, in Claim's order (both claim paths).
_CLAIMED: Final = "id, token, name, queue, payload, attempts, max_attempts, context, run_at, alone"
# What a claim reads of each candidate (_claim_in).
_CANDIDATE: Final = (
    "priority, run_at, id, state, attempts, max_attempts, queue,"
    " slot_key IS NOT NULL OR rate_key IS NOT NULL"
)
# A suspect (rules.is_suspect), as jobs_suspects' WHERE says it: SQLite uses a partial index
# only for a query whose WHERE repeats the index's term.
_SUSPECT: Final = f"orphans >= {SUSPECT_AT}"

# Candidates and lapsed rows by (priority, run_at, id), their first three columns: a key made
# in C, where a lambda called once a row was a share of each claim (issue 44).
_CLAIM_ORDER = operator.itemgetter(0, 1, 2)


def _renew_in(
    conn: sqlite3.Connection,
    now: float,
    leases: Sequence[Lease],
    lease: float,
    started: Sequence[ClaimToken],
) -> RenewResult:
    """Driver.renew on ``conn``, for the driver's door and the lease lifeline alike."""
    pairs = json.dumps([[one.job_id, one.token] for one in leases])
    starts = json.dumps(list(started))
    # One statement for every lease the worker holds; the row-value IN is the fence
    # (id, token, running) for all of them at once, searched by primary key.
    rows = conn.execute(
        "UPDATE jobs SET lease_until = ?, updated_at = ?,"
        " ahead = ahead AND token NOT IN (SELECT value FROM json_each(?))"
        " WHERE state = 'running' AND (id, token) IN"
        " (SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]')"
        "  FROM json_each(?))"
        " RETURNING token, cancel_requested, slot_key IS NOT NULL",
        (now + lease, now, starts, pairs),
    ).fetchall()
    with_slot = [row[0] for row in rows if row[2]]
    kept = set()
    if with_slot:
        # The slot rows renew with their runs; a run whose row another took has lost it.
        kept = {
            row[0]
            for row in conn.execute(
                "UPDATE limit_rows SET until = ? WHERE kind = 'slot' AND token IN"
                " (SELECT value FROM json_each(?)) RETURNING token",
                (now + lease, json.dumps(with_slot)),
            )
        }
    return RenewResult(
        held=frozenset(row[0] for row in rows),
        cancel_requested=frozenset(row[0] for row in rows if row[1]),
        slot_lost=frozenset(t for t in with_slot if t not in kept),
    )


def _lapsed_before(asked: float, rescue: bool) -> float:
    """The latest lease a claim asked for at ``asked`` may rescue. Not its start's ``now``: a
    claim held up by a locked file (another process's long write) must not take the jobs
    whose leases ran out while it waited; their workers, held up as long, may hold their
    results (issue 32). PostgreSQL's claim reads its send time the same way ($1)."""
    return asked if rescue else -math.inf


def _claim_in(
    conn: sqlite3.Connection,
    now: float,
    slots: ClaimSlots,
    lease: float,
    worker_id: str,
    free: Mapping[str, int] | None = None,
    *,
    lapsed_before: float = math.inf,
    alone: bool = False,
) -> list[Claim]:
    """The claim, inside the caller's transaction (claim, and settle_and_claim after its
    settles: a job settled there is no longer running, so never a lapsed one; one retried at
    once is ready, and may be claimed as any ready job would be)."""
    paused = _paused(conn)  # nothing of a paused queue is claimed, lapsed or not
    asked = {queue: cap for queue, cap in slots.caps.items() if queue not in paused}
    if lapsed_before != -math.inf:  # else no lapsed lease this time (after an outage)
        _release_lapsed(conn, asked, min(now, lapsed_before), slots.total, now)
    # Per queue and state, each read stops after `limit` rows in claim order (the
    # jobs_claim index). The merge is Python's sort, so the order is the memory driver's to
    # the letter. INDEXED BY: left to itself SQLite picks jobs_next_due (it also matches
    # run_at) and sorts every due row before the LIMIT: 3.8 ms a claim at 20,000 queued,
    # against 0.04 ms reading jobs_claim in order.
    candidates: list[Any] = []
    if alone:
        # The due suspects first, off their own index (a handful): the first one alone.
        for queue in asked:
            for state in WAITING_STATES:
                candidates += conn.execute(
                    f"SELECT {_CANDIDATE} FROM jobs INDEXED BY jobs_suspects"
                    f" WHERE queue = ? AND state = ? AND run_at <= ? AND {_SUSPECT}"
                    " ORDER BY priority, run_at, id LIMIT 1",
                    (queue, state, now),
                ).fetchall()
        candidates = sorted(candidates, key=_CLAIM_ORDER)[:1]
    if not candidates:
        for queue, cap in asked.items():
            for state in WAITING_STATES:
                candidates += conn.execute(
                    f"SELECT {_CANDIDATE} FROM jobs INDEXED BY jobs_claim"
                    f" WHERE queue = ? AND state = ? AND run_at <= ? AND NOT {_SUSPECT}"
                    " ORDER BY priority, run_at, id LIMIT ?",
                    (queue, state, now, cap),
                ).fetchall()
        candidates.sort(key=_CLAIM_ORDER)
    taken = slots.take((row[6], row[2]) for row in candidates)
    limited = {row[2] for row in candidates if row[7]}
    queue_of = {row[2]: row[6] for row in candidates}
    ahead = set(slots.ahead(((queue_of[i], i) for i in taken), free)) - limited
    by_id: dict[str, Any] = {}
    if limited & set(taken):
        # Jobs with fleet limits: the shared rule decides them (_limit_rules.py).
        by_id = _claim_limited(conn, [i for i in taken if i in limited], now, lease, worker_id)
        taken = [i for i in taken if i not in limited or i in by_id]
    unlimited = [i for i in taken if i not in by_id]
    if not taken:
        return []
    # One UPDATE for the batch; each row draws its own fresh token. A suspect is only ever
    # taken alone (above), so it runs alone: marked, for the rescue that may find it lapsed.
    rows = conn.execute(
        "UPDATE jobs SET state = 'running', lease_until = ?, attempts = attempts + 1,"
        " ahead = (id IN (SELECT value FROM json_each(?))),"
        f" alone = {_SUSPECT},"
        " worker_id = ?, token = lower(hex(randomblob(12))), wait_event = NULL, wait_key = NULL,"
        " updated_at = ?"
        " WHERE id IN (SELECT value FROM json_each(?))"
        f" RETURNING {_CLAIMED}",
        (
            now + lease,
            json.dumps(sorted(ahead)),
            worker_id,
            now,
            json.dumps(unlimited),
        ),
    ).fetchall()
    by_id.update((row[0], row) for row in rows)
    # Each row looked up once and passed by position, in Claim's field order: in the driver's
    # thread, whose Python holds the GIL the worker's loop needs (issue 44).
    lease_until = now + lease
    return [
        Claim(
            job_id,
            row[1],  # token
            row[2],  # name
            row[3],  # queue
            row[4],  # payload
            row[5],  # attempt
            row[6],  # max_attempts
            lease_until,
            row[7],  # context
            job_id in ahead,
            row[8],  # due_at
            bool(row[9]),  # alone
        )
        for job_id, row in zip(taken, map(by_id.__getitem__, taken), strict=True)
    ]


def _release_lapsed(
    conn: sqlite3.Connection, asked: Mapping[str, int], lapsed: float, most: int, now: float
) -> None:
    """Up to ``most`` jobs of ``asked`` whose lease lapsed by ``lapsed``, handed back before
    the claim looks (the memory driver's _release_lapsed, in SQL): never started (taken ahead,
    rules.hands_back_lapse) as they were; else orphaned by rules.orphaning, recorded in their
    history and logged. INDEXED BY jobs_next_due: once ANALYZE has run on a queue of ready
    jobs, its statistics say `state = 'running'` matches every row, and SQLite scans the whole
    table instead (37 ms a claim with 200,000 waiting; a worker fell from 1,100 to 150 jobs/s)."""
    rows: list[Any] = []
    for queue in asked:
        rows += conn.execute(
            f"SELECT priority, run_at, id, {JOB_COLUMNS}, ahead, ahead_lapses, alone,"
            " attempt_seq FROM jobs INDEXED BY jobs_next_due"
            " WHERE queue = ? AND state = 'running' AND lease_until <= ?",
            (queue, lapsed),
        ).fetchall()
    rows.sort(key=_CLAIM_ORDER)
    history = []
    for row in rows[:most]:
        record = job_record(row[3:-4])
        ahead, ahead_lapses, alone, seq = row[-4:]
        if hands_back_lapse(bool(ahead), ahead_lapses, record.max_attempts):
            # Its `alone` mark cleared too, as memory and PostgreSQL do: a claim that does not
            # write it (the previous release's, in a rolling upgrade) would find it still set.
            conn.execute(
                "UPDATE jobs SET state = 'ready', attempts = attempts - 1, ahead = 0, alone = 0,"
                " ahead_lapses = ahead_lapses + 1, token = NULL, lease_until = NULL,"
                " worker_id = NULL, last_error = ?, updated_at = ? WHERE id = ?",
                (LAPSED_ERROR, now, record.id),
            )
            continue
        rule = orphaning(record.orphans, bool(alone), record.cancel_requested)
        conn.execute(
            "UPDATE jobs SET state = ?, attempts = attempts - ?, orphans = ?, ahead = 0,"
            " alone = 0, token = NULL, lease_until = NULL, worker_id = NULL,"
            " cancel_requested = cancel_requested AND ? = 'dead', last_error = ?,"
            " updated_at = ?, attempt_seq = attempt_seq + 1 WHERE id = ?",
            (
                rule.state.value,
                int(rule.hands_back),
                rule.orphans,
                rule.state.value,
                rule.error,
                now,
                record.id,
            ),
        )
        entry = orphaned_record(record, rule, seq + 1, now)
        history.append((record.id, entry.seq % ATTEMPT_HISTORY, *_attempt_values(entry)))
        log_orphaned(record.id, record.name, record.worker_id, record.attempts, rule)
    if history:
        conn.executemany(_INSERT_HISTORY, history)


def _claim_limited(
    conn: sqlite3.Connection, ids: Sequence[JobId], now: float, lease: float, worker_id: str
) -> dict[JobId, Any]:
    """Claim what the limits allow of ``ids`` (claim order), put the rest off; answer the
    granted rows as claim()'s RETURNING gives them. Under BEGIN IMMEDIATE: no other claim reads
    the limit rows meanwhile, so a row never written is simply free."""
    found = {
        row[0]: JobLimits(*row[1:])
        for row in conn.execute(
            "SELECT id, slot_key, slots, rate_key, starts, per FROM jobs"
            " WHERE id IN (SELECT value FROM json_each(?))",
            (json.dumps(list(ids)),),
        )
    }
    candidates = [(job_id, found[job_id]) for job_id in ids]
    keys = {(kind, key) for _, limits in candidates for kind, key, _ in needs(limits)}
    rows = {
        (kind, key): [
            LimitRow(*row)
            for row in conn.execute(
                "SELECT kind, key, n, until, token, job_id FROM limit_rows"
                " WHERE kind = ? AND key = ?",
                (kind, key),
            )
        ]
        for kind, key in keys
    }
    decision = decide(candidates, rows, now=now, lease=lease, missing_is_free=True)
    conn.executemany(
        "INSERT INTO limit_rows (kind, key, n, until, token, job_id) VALUES (?, ?, ?, ?, ?, ?)"
        " ON CONFLICT (kind, key, n) DO UPDATE SET until = excluded.until,"
        " token = excluded.token, job_id = excluded.job_id",
        [attrs.astuple(row) for row in decision.taken],
    )
    # A lapsed job put off goes back to ready, its lapse recorded (its attempt stays counted).
    conn.executemany(
        "UPDATE jobs SET run_at = ?, waiting_on = ?, updated_at = ?,"
        " last_error = CASE WHEN state = 'running' THEN ? ELSE last_error END,"
        " state = CASE WHEN state = 'running' THEN 'ready' ELSE state END,"
        " token = NULL, lease_until = NULL, worker_id = NULL WHERE id = ?",
        [
            (run_at, waits, now, LAPSED_ERROR, job_id)
            for job_id, (run_at, waits) in decision.put_off.items()
        ],
    )
    granted: dict[JobId, Any] = {}
    for job_id, token in decision.granted.items():
        granted[job_id] = conn.execute(
            "UPDATE jobs SET state = 'running', attempts = attempts + 1, lease_until = ?,"
            f" alone = {_SUSPECT},"
            " worker_id = ?, token = ?, wait_event = NULL, wait_key = NULL, waiting_on = NULL,"
            " last_error = CASE WHEN state = 'running' THEN ? ELSE last_error END,"
            " updated_at = ? WHERE id = ?"
            f" RETURNING {_CLAIMED}",
            (now + lease, worker_id, token, LAPSED_ERROR, now, job_id),
        ).fetchone()
    return granted


class _SqliteBeside:
    """The lease lifeline's own connection to the file: opened in its thread at its first call,
    waiting out another writer for up to ``busy_timeout`` there (this thread may block)."""

    def __init__(self, path: str, busy_timeout: float, clock: Callable[[], float]) -> None:
        self._path = path
        self._busy_timeout = busy_timeout
        self._clock = clock
        self._conn: sqlite3.Connection | None = None

    def renew(self, leases: Sequence[Lease], *, lease: float) -> frozenset[ClaimToken]:
        return self._write(lambda conn, now: _renew_in(conn, now, leases, lease, ()).held)

    def settle(self, settlements: Sequence[Settlement]) -> Sequence[JobId]:
        return self._write(lambda conn, now: _settle_all(conn, settlements, now))

    def _write(self, work: Work[T]) -> T:
        try:
            if self._conn is None:
                self._conn = open_beside(self._path, self._busy_timeout)
            conn = self._conn
            conn.execute("BEGIN IMMEDIATE")
            try:
                answer = work(conn, self._clock())
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            return answer
        except sqlite3.Error as exc:
            raise DriverError(
                f"SQLite failed on {self._path!r} (the lease lifeline's connection): {exc}",
                fix="check the disk and the file; the worker's own connection retries",
            ) from exc

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class SqliteJobs(ClaimCalls, SqliteConnection):
    """Enqueue, claim, renew and settle: a job's way from written to ended."""

    # Enqueue and claim.

    async def enqueue(
        self, jobs: Sequence[NewJob], *, connection: object | None = None
    ) -> Sequence[Enqueued]:
        jobs = list(jobs)
        conn, tx = unwrap(connection)

        def work(conn: sqlite3.Connection, now: float) -> list[Enqueued]:
            return insert_jobs(conn, jobs, now)

        if conn is not None:
            return await self._on_callers(conn, tx, work, wake=True)
        answers = await self._transact(work)
        self._wake()
        return answers

    async def _claim(self, ask: ClaimAsk) -> Sequence[Claim]:
        queues, limit, lease, worker_id, free, rescue = ask.parts()
        alone = ask.alone
        slots = ClaimSlots.of(queues, limit)
        lapsed_before = _lapsed_before(self.now(), rescue)

        def work(conn: sqlite3.Connection, now: float) -> list[Claim]:
            return _claim_in(
                conn, now, slots, lease, worker_id, free, lapsed_before=lapsed_before, alone=alone
            )

        return await self._transact(work)

    # Writes of a run, fenced by its lease.

    async def renew(
        self, leases: Sequence[Lease], *, lease: float, started: Sequence[ClaimToken] = ()
    ) -> RenewResult:
        def work(conn: sqlite3.Connection, now: float) -> RenewResult:
            return _renew_in(conn, now, leases, lease, started)

        return await self._transact(work)

    def beside(self) -> BesideConnection:
        return _SqliteBeside(self.path, self._door.busy_timeout, self.now)

    async def hand_back_unheld(
        self, worker_id: str, queues: Sequence[str], held: Sequence[ClaimToken]
    ) -> Sequence[JobId]:
        def work(conn: sqlite3.Connection, now: float) -> list[JobId]:
            rows = conn.execute(
                "UPDATE jobs SET ahead = 1, lease_until = ?, updated_at = ?"
                " WHERE state = 'running' AND worker_id = ?"
                " AND queue IN (SELECT value FROM json_each(?))"
                " AND token NOT IN (SELECT value FROM json_each(?)) RETURNING id",
                (now, now, worker_id, json.dumps(list(queues)), json.dumps(list(held))),
            ).fetchall()
            return [row[0] for row in rows]

        return await self._transact(work)

    async def unmark_alone(self, leases: Sequence[Lease]) -> Sequence[JobId]:
        def work(conn: sqlite3.Connection, now: float) -> list[JobId]:
            # Only the mark (not even updated_at): the run keeps its lease, so nobody claims
            # it until that lapses.
            rows = conn.execute(
                "UPDATE jobs SET alone = 0 WHERE state = 'running' AND (id, token) IN"
                " (SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]')"
                "  FROM json_each(?)) RETURNING id",
                (json.dumps([[one.job_id, one.token] for one in leases]),),
            ).fetchall()
            return [row[0] for row in rows]

        return await self._transact(work)

    async def settle(self, settlements: Sequence[Settlement]) -> Sequence[JobId]:
        settlements = list(settlements)

        def work(conn: sqlite3.Connection, now: float) -> list[JobId]:
            # In order, one transaction: a second settlement of the same lease in the batch
            # finds the token already cleared and applies nothing, as it would in two calls.
            return _settle_all(conn, settlements, now)

        applied = await self._transact(work)
        self._wake()
        return applied

    async def _settle_and_claim(
        self, settlements: Sequence[Settlement], ask: ClaimAsk
    ) -> tuple[Sequence[JobId], Sequence[Claim]]:
        queues, limit, lease, worker_id, free, rescue = ask.parts()
        alone = ask.alone
        settlements = list(settlements)
        slots = ClaimSlots.of(queues, limit)
        lapsed_before = _lapsed_before(self.now(), rescue)

        def work(conn: sqlite3.Connection, now: float) -> tuple[list[JobId], list[Claim]]:
            # One transaction, one trip through the thread door and one commit where there
            # were two of each: the settles first, in order, as settle() applies them.
            applied = _settle_all(conn, settlements, now)
            claims = _claim_in(
                conn, now, slots, lease, worker_id, free, lapsed_before=lapsed_before, alone=alone
            )
            return applied, claims

        answers = await self._transact(work)
        self._wake()
        return answers

    # Wake-ups.

    async def _wait_for_work(
        self, queues: Sequence[str], timeout: float, rescue_from: float | None, alone: bool
    ) -> None:
        """No cross-process notification exists in SQLite: this driver's own writes wake a
        waiter at once; another connection's commit (another process's enqueue, a producer's)
        ends the wait once its data version moves (``_await_wake_up``), and the caller looks
        again; at the latest every ``poll_interval``."""
        wanted = list(dict.fromkeys(queues))
        lapses_from = -math.inf if rescue_from is None else rescue_from

        def work(conn: sqlite3.Connection, now: float) -> tuple[float, int]:
            return soonest_work(conn, now), data_version(conn)

        def soonest_work(conn: sqlite3.Connection, now: float) -> float:
            soonest = math.inf
            paused = _paused(conn)  # a paused queue's jobs are no work
            # INDEXED BY: the lease look reads the queue's running rows, never the table (what
            # SQLite picks once ANALYZE has seen a queue of ready jobs, as in claim()). The
            # waiting looks read in run-at order and stop at the first job that is work for
            # this waiter (a suspect is only for one alone: Driver.wait_for_work).
            for queue in wanted:
                if queue in paused:
                    continue
                for state in WAITING_STATES:
                    row = conn.execute(
                        "SELECT run_at FROM jobs INDEXED BY jobs_next_due"
                        f" WHERE queue = ? AND state = ? AND (NOT {_SUSPECT} OR ?)"
                        " ORDER BY run_at LIMIT 1",
                        (queue, state, alone),
                    ).fetchone()
                    if row is not None:
                        soonest = min(soonest, row[0] - now)
                (when,) = conn.execute(
                    "SELECT min(lease_until) FROM jobs INDEXED BY jobs_next_due"
                    " WHERE queue = ? AND state = 'running'",
                    (queue,),
                ).fetchone()
                if when is not None:
                    soonest = min(soonest, max(when, lapses_from) - now)
            return soonest

        wakes = self._wakes
        due_in, version = await self._transact(work, mode="read")
        if due_in <= 0 or self._wakes != wakes:
            return
        with trio.move_on_after(min(timeout, due_in, self._poll_interval)):
            await self._await_wake_up(self._lot, version)
