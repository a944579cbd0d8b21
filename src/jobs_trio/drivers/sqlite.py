# The SQLite driver: the whole contract on one WAL database file that worker processes on one
# machine share, as SQL. Apart from the door to the connection (_sqlite_door.py: threads, cancel,
# busy retry) and the file itself (_sqlite_migrate.py: URL, identity, migrations, WAL).
from __future__ import annotations

import contextlib
import json
import math
import operator
import os
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any, Final, TypeVar

import attrs
import trio

from .._core.errors import (
    ConfigError,
    DriverError,
)
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
    WAITING_STATES,
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
from ._limit_rules import SLOT, LimitRow, decide, needs, waiting_on
from ._retention import DEAD_STATE, FINISHED_STATES, cutoffs, turn_is_free
from ._rules import (
    ATTEMPT_HISTORY,
    FIRE_HISTORY,
    FORGET_WORKERS_AFTER,
    JOB_COLUMNS,
    LAPSED_ERROR,
    LIVE_STATES_SQL,
    WAITING_STATES_SQL,
    Effect,
    Unseen,
    decode_jobs,
    effect,
    encode_jobs,
    event_mark,
    hands_back_lapse,
    history_record,
    job_record,
    lapsed_out_of_attempts,
    limit_fields,
    name_stats,
    queue_stats,
    refuse_in_place,
    relay_fenced,
    ticket_stale_at,
    woken,
)
from ._sqlite_door import Mode, SqliteDoor, Work
from ._sqlite_enqueue import caller_error, insert_jobs, refuse_another_file, store_event, write_in
from ._sqlite_migrate import open_beside, open_sqlite_file
from ._transaction import SqliteOps, Transaction, owned, unwrap
from .contract import BesideConnection, Capabilities, Driver

T = TypeVar("T")

# How long wait_for_work sleeps before looking at the file again when nothing is due. SQLite has
# no cross-process notification: a job another process enqueues is seen at the next look, so
# this is the worst-case pickup delay across processes (this process's own writes wake at once).
POLL_INTERVAL: Final = 0.5


class _FireTaken(Exception):
    """A fire of this task and scheduled time is already on record: roll the advance back."""


# Rows to records.

# Column names are the record's field names, so a row maps onto its record by name (the job's:
# rules.JOB_COLUMNS).
_STEP_FIELDS: Final = (
    "name", "status", "started_at", "finished_at", "result", "wake_at", "event", "match",
)  # fmt: skip
_STEP_COLUMNS: Final = ", ".join(_STEP_FIELDS)
_EVENT_COLUMNS: Final = "id, name, key, payload, created_at"
_ATTEMPT_FIELDS: Final = tuple(field.name for field in attrs.fields(AttemptRecord))
_ATTEMPT_COLUMNS: Final = ", ".join(_ATTEMPT_FIELDS)
_WORKER_FIELDS: Final = tuple(field.name for field in attrs.fields(WorkerPresence))
_WORKER_COLUMNS: Final = ", ".join(_WORKER_FIELDS)
# What a claim reads back of each job it took, in Claim's order (both claim paths).
_CLAIMED: Final = "id, token, name, queue, payload, attempts, max_attempts, context, run_at"
# Fencing: a write of a run applies only while its claim is the job's current one.
_FENCE: Final = "id = ? AND token = ? AND state = 'running'"
# One attempt's history record (_history_row's values).
_INSERT_HISTORY: Final = (
    f"INSERT OR REPLACE INTO attempts (job_id, slot, {_ATTEMPT_COLUMNS})"
    f" VALUES (?, ?, {', '.join('?' for _ in _ATTEMPT_FIELDS)})"
)
# A record's values in _ATTEMPT_FIELDS' order, read in C: attrs.astuple's general walk was a
# tenth of a settle's work in the driver's thread, which the worker's loop waits on (issue 35).
_attempt_values = operator.attrgetter(*_ATTEMPT_FIELDS)


def _step(row: Sequence[Any]) -> StepRecord:
    fields = dict(zip(_STEP_FIELDS, row, strict=True))
    fields["status"] = StepStatus(fields["status"])
    return StepRecord(**fields)


def _presence(row: Sequence[Any]) -> WorkerPresence:
    fields = dict(zip(_WORKER_FIELDS, row, strict=True))
    fields["queues"] = tuple(json.loads(fields["queues"]))
    fields["jobs"] = decode_jobs(fields["jobs"])
    return WorkerPresence(**fields)


def _event(row: Any) -> EventRecord:
    return EventRecord(id=str(row[0]), name=row[1], key=row[2], payload=row[3], created_at=row[4])


def _job_or_raise(conn: sqlite3.Connection, job_id: JobId) -> JobRecord:
    row = conn.execute(f"SELECT {JOB_COLUMNS} FROM jobs WHERE id = ?", (job_id,)).fetchone()
    return job_record(found(row, job_id))


def _paused(conn: sqlite3.Connection) -> set[str]:
    """The paused queues, read in the caller's transaction: a claim's reads them under its
    write lock, so it is ordered before or after a pause, never beside it."""
    return {row[0] for row in conn.execute("SELECT queue FROM queue_pauses")}


def _pauses(conn: sqlite3.Connection) -> list[QueuePause]:
    rows = conn.execute(
        "SELECT queue, paused_at, paused_by, coalesce(epoch, 0) FROM queue_pauses ORDER BY queue"
    )
    return [QueuePause(*row) for row in rows]


def _next_pause_epoch(conn: sqlite3.Connection) -> int:
    """One more change of the pauses, in the caller's write transaction (one at a time)."""
    (epoch,) = conn.execute(
        "UPDATE pause_epoch SET epoch = epoch + 1 WHERE id = 1 RETURNING epoch"
    ).fetchone()
    return int(epoch)


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


def _settle_all(
    conn: sqlite3.Connection, settlements: Sequence[Settlement], now: float
) -> list[JobId]:
    """``settlements`` in order, in the caller's transaction; answers the job ids that applied.
    Completions of jobs the batch settles once are written together (_complete_all): a worker's
    batch is mostly these, and an UPDATE and an INSERT per job were most of a settle's cost
    (issue 35). Where a job is settled twice, every one is written in its turn."""
    ids = [s.lease.job_id for s in settlements]
    if len(set(ids)) < len(ids):
        return [s.lease.job_id for s in settlements if _settle_one(conn, s, now)]
    together = [s for s in settlements if type(s) is Complete and _plain_result(s.result)]
    if len(together) < 2:
        together = []  # one alone is one statement either way
    applied = _complete_all(conn, together, now) if together else set()
    written_together = {id(s) for s in together}
    for s in settlements:
        if id(s) not in written_together and _settle_one(conn, s, now):
            applied.add(s.lease.job_id)
    return [job_id for job_id in ids if job_id in applied]


# The largest result written with others in one statement (_settle_all): a batch of them is a
# few MiB of JSON at most, far inside SQLite's limit on one value (1 GB), which a batch of
# 1 MiB results, twice as long escaped, could pass.
_TOGETHER_AT_MOST = 64 * 1024


def _plain_result(result: str | None) -> bool:
    """Whether a completion's result goes through the JSON of _complete_all unchanged: what
    dump_json makes (ASCII, no NUL) and small. Anything else is written alone, as it always
    was (a lone surrogate refused there, not stored as bytes that cannot be read back)."""
    return result is None or (
        len(result) <= _TOGETHER_AT_MOST and result.isascii() and "\x00" not in result
    )


def _complete_all(
    conn: sqlite3.Connection, completes: Sequence[Complete], now: float
) -> set[JobId]:
    """What _write_settlement writes for each completion, fenced the same way, in one UPDATE
    for all and one INSERT for their history (each job once in ``completes``)."""
    rows = conn.execute(
        "UPDATE jobs SET state = 'completed', result = json_extract(u.value, '$[2]'),"
        " lease_until = NULL, worker_id = NULL, cancel_requested = 0, token = NULL,"
        " updated_at = ?, attempt_seq = attempt_seq + 1"
        " FROM json_each(?) AS u"
        " WHERE jobs.id = json_extract(u.value, '$[0]')"
        " AND jobs.token = json_extract(u.value, '$[1]') AND jobs.state = 'running'"
        " RETURNING jobs.id, jobs.slot_key, jobs.attempt_seq",
        (now, json.dumps([[s.lease.job_id, s.lease.token, s.result] for s in completes])),
    ).fetchall()
    done = {row[0]: row for row in rows}
    history = []
    for s in completes:
        row = done.get(s.lease.job_id)
        if row is None:
            continue
        if row[1] is not None:
            _release_slot(conn, s.lease.token, now)
        if s.note is not None:
            history.append(_history_row(s, effect(s), row[2], now))
    if history:
        conn.executemany(_INSERT_HISTORY, history)
    return set(done)


def _history_row(s: Settlement, change: Effect, seq: int, now: float) -> tuple[object, ...]:
    """The attempts row of ``s`` (which has a note) as applied by ``change``: the ring's slot,
    so a job keeps ATTEMPT_HISTORY (the oldest record there is replaced)."""
    record = history_record(s, change, seq, now)
    return (s.lease.job_id, record.seq % ATTEMPT_HISTORY, *_attempt_values(record))


def _settle_one(conn: sqlite3.Connection, s: Settlement, now: float) -> bool:
    """One fenced UPDATE; True when the lease's token was still the job's current one."""
    instead = cancel_instead(s)
    # An operator's pending cancel turns an ending that would leave the job live into a cancel;
    # tried first, fenced and only where the flag is set, in the batch's one transaction.
    if instead is not None and _write_settlement(conn, instead, now, " AND cancel_requested = 1"):
        return True
    return _write_settlement(conn, s, now)


def _write_settlement(conn: sqlite3.Connection, s: Settlement, now: float, also: str = "") -> bool:
    change = effect(s)
    # In the settle's write transaction: a send either committed before it (its event is read
    # here) or commits after it (and finds the job suspended, to wake it).
    if change.unseen is not None and _stored_past(conn, change.unseen):
        change = woken(change)
    # Column names are rules' own record field names, never a caller's text.
    written: dict[str, object] = {"state": change.state.value, **change.writes}
    if change.delay is not None:
        written["run_at"] = now + max(change.delay, 0.0)
    changes = ", ".join(f"{column} = ?" for column in written)
    row = conn.execute(
        f"UPDATE jobs SET {changes}, attempts = attempts - ?, lease_until = NULL,"
        f" worker_id = NULL, cancel_requested = 0, token = NULL, updated_at = ?,"
        f" attempt_seq = attempt_seq + 1 WHERE {_FENCE}{also} RETURNING slot_key, attempt_seq",
        (
            *written.values(),
            int(change.hands_back),
            now,
            s.lease.job_id,
            s.lease.token,
        ),
    ).fetchone()
    if row is None:
        return False
    if row[0] is not None:
        _release_slot(conn, s.lease.token, now)
    if s.note is not None:
        conn.execute(_INSERT_HISTORY, _history_row(s, change, row[1], now))
    return True


def _stored_past(conn: sqlite3.Connection, unseen: Unseen) -> bool:
    row = conn.execute(
        "SELECT EXISTS (SELECT 1 FROM events INDEXED BY events_by_name WHERE name = ? AND id > ?"
        " AND (? IS NULL OR key = ?))",
        (unseen.event, int(unseen.mark), unseen.key, unseen.key),
    ).fetchone()
    return bool(row[0])


def _release_slot(conn: sqlite3.Connection, token: str, now: float) -> None:
    """In the settle's transaction: the run's slot row is free, and the first job a claim put
    off waiting on that slot is due now."""
    for (key,) in conn.execute(
        "UPDATE limit_rows SET until = NULL, token = NULL, job_id = NULL"
        " WHERE kind = 'slot' AND token = ? RETURNING key",
        (token,),
    ).fetchall():
        conn.execute(
            "UPDATE jobs SET run_at = ?, updated_at = ? WHERE id = (SELECT id FROM jobs"
            " INDEXED BY jobs_waiting_on WHERE waiting_on = ?"
            f" AND state IN {WAITING_STATES_SQL}"
            " AND run_at > ? ORDER BY priority, run_at, id LIMIT 1)",
            (now, now, waiting_on(SLOT, key), now),
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
) -> list[Claim]:
    """The claim, inside the caller's transaction (claim, and settle_and_claim after its
    settles: a job settled there is no longer running, so never a lapsed candidate; one
    retried at once is ready, and may be claimed as any ready job would be)."""
    # Per queue and state, each read stops after `limit` rows in claim order (the
    # jobs_claim index); lapsed leases are few (at most the running jobs). The merge
    # is Python's sort, so the order is the memory driver's to the letter.
    # INDEXED BY: left to itself SQLite picks jobs_next_due (it also matches run_at)
    # and sorts every due row before the LIMIT: 3.8 ms a claim at 20,000 queued,
    # against 0.04 ms reading jobs_claim in order. And the lapsed leases by
    # (queue, state): once ANALYZE has run on a queue of ready jobs, its statistics say
    # `state = 'running'` matches every row, and SQLite scans the whole table instead
    # (37 ms a claim with 200,000 waiting; a worker fell from 1,100 to 150 jobs/s).
    candidates: list[Any] = []
    paused = _paused(conn)  # nothing of a paused queue is claimed, lapsed or not
    for queue, cap in slots.caps.items():
        if queue in paused:
            continue
        for state in WAITING_STATES:
            candidates += conn.execute(
                "SELECT priority, run_at, id, state, attempts, max_attempts, queue,"
                " slot_key IS NOT NULL OR rate_key IS NOT NULL, ahead, ahead_lapses"
                " FROM jobs INDEXED BY jobs_claim"
                " WHERE queue = ? AND state = ? AND run_at <= ?"
                " ORDER BY priority, run_at, id LIMIT ?",
                (queue, state, now, cap),
            ).fetchall()
        if lapsed_before == -math.inf:
            continue  # no lapsed lease this time (Driver.claim: after an outage)
        candidates += conn.execute(
            "SELECT priority, run_at, id, state, attempts, max_attempts, queue,"
            " slot_key IS NOT NULL OR rate_key IS NOT NULL, ahead, ahead_lapses"
            " FROM jobs INDEXED BY jobs_next_due"
            " WHERE queue = ? AND state = 'running' AND lease_until <= ?",
            (queue, min(now, lapsed_before)),
        ).fetchall()
    candidates.sort(key=lambda row: (row[0], row[1], row[2]))
    # Attempts are counted at claim, so a job that keeps killing its worker ends here
    # instead of looping forever. Up to `limit` of them per claim, apart from the
    # `limit` taken (the memory driver's rule): the rest stay lapsed for the next claim.
    handed_back = {
        row[2]
        for row in candidates
        if row[3] == "running" and hands_back_lapse(bool(row[8]), row[9], row[5])
    }
    exhausted = [
        row
        for row in candidates
        if row[3] == "running" and row[4] >= row[5] and row[2] not in handed_back
    ]
    dead = [(lapsed_out_of_attempts(row[4]), now, row[2]) for row in exhausted[: slots.total]]
    skipped = {row[2] for row in exhausted}
    taken = slots.take((row[6], row[2]) for row in candidates if row[2] not in skipped)
    conn.executemany(
        "UPDATE jobs SET state = 'dead', lease_until = NULL, worker_id = NULL,"
        " token = NULL, last_error = ?, updated_at = ? WHERE id = ?",
        dead,
    )
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
    # One UPDATE for the batch; each row draws its own fresh token.
    handed_back_json = json.dumps(sorted(handed_back & set(unlimited)))
    rows = conn.execute(
        "UPDATE jobs SET state = 'running', lease_until = ?,"
        " attempts = attempts + 1 - (id IN (SELECT value FROM json_each(?))),"
        " ahead_lapses = ahead_lapses + (id IN (SELECT value FROM json_each(?))),"
        " ahead = (id IN (SELECT value FROM json_each(?))),"
        " worker_id = ?, token = lower(hex(randomblob(12))), wait_event = NULL, wait_key = NULL,"
        " last_error = CASE WHEN state = 'running' THEN ? ELSE last_error END,"
        " updated_at = ?"
        " WHERE id IN (SELECT value FROM json_each(?))"
        f" RETURNING {_CLAIMED}",
        (
            now + lease,
            handed_back_json,
            handed_back_json,
            json.dumps(sorted(ahead)),
            worker_id,
            LAPSED_ERROR,
            now,
            json.dumps(unlimited),
        ),
    ).fetchall()
    by_id.update((row[0], row) for row in rows)
    return [
        Claim(
            job_id=job_id,
            token=by_id[job_id][1],
            name=by_id[job_id][2],
            queue=by_id[job_id][3],
            payload=by_id[job_id][4],
            attempt=by_id[job_id][5],
            max_attempts=by_id[job_id][6],
            lease_until=now + lease,
            context=by_id[job_id][7],
            ahead=job_id in ahead,
            due_at=by_id[job_id][8],
        )
        for job_id in taken
    ]


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
            " worker_id = ?, token = ?, wait_event = NULL, wait_key = NULL, waiting_on = NULL,"
            " last_error = CASE WHEN state = 'running' THEN ? ELSE last_error END,"
            " updated_at = ? WHERE id = ?"
            f" RETURNING {_CLAIMED}",
            (now + lease, worker_id, token, LAPSED_ERROR, now, job_id),
        ).fetchone()
    return granted


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


class SqliteDriver:
    """Jobs in one SQLite file, reached through one connection that one worker thread at a time
    uses. Open it with `open_sqlite_driver`, which prepares the schema and closes it after."""

    # Every capability of the contract (Capabilities): the conformance suite tests each.
    capabilities = Capabilities(
        settles_with_claims=True,
        claims_ahead=True,
        rescue_on_request=True,
        renews_beside=True,
        hands_back_unheld=True,
    )

    def __init__(self, door: SqliteDoor, *, url: str, poll_interval: float = POLL_INTERVAL) -> None:
        self.url = url
        self.path = door.path
        self._door = door
        self._poll_interval = poll_interval
        self._lot = trio.lowlevel.ParkingLot()
        # Bumped by every wake-up, so a waiter that looked at the file while a write of this
        # driver was landing does not then sleep through that write's wake-up.
        self._wakes = 0
        # The same for pauses and resumes (wait_for_pauses): apart, so that a worker's watch on
        # its queues' pauses does not look again at every enqueue of its process.
        self._pause_lot = trio.lowlevel.ParkingLot()
        self._pause_changes = 0

    @property
    def _conn(self) -> sqlite3.Connection:
        return self._door.conn

    def now(self) -> float:
        return self._door.now()

    def _wake(self) -> None:
        self._wakes += 1
        self._lot.unpark_all()

    def _pause_changed(self) -> None:
        self._pause_changes += 1
        self._pause_lot.unpark_all()

    async def _transact(self, work: Work[T], *, mode: Mode = "write") -> T:
        """The door every call goes through: ``work(conn, now)`` in one transaction in a
        worker thread (_sqlite_door.py says how a cancel and a busy file are handled)."""
        return await self._door.transact(work, mode=mode)

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
        slots = ClaimSlots.of(queues, limit)
        lapsed_before = _lapsed_before(self.now(), rescue)

        def work(conn: sqlite3.Connection, now: float) -> list[Claim]:
            return _claim_in(conn, now, slots, lease, worker_id, free, lapsed_before=lapsed_before)

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

    async def settle(self, settlements: Sequence[Settlement]) -> Sequence[JobId]:
        settlements = list(settlements)

        def work(conn: sqlite3.Connection, now: float) -> list[JobId]:
            # In order, one transaction: a second settlement of the same lease in the batch
            # finds the token already cleared and applies nothing, as it would in two calls.
            return _settle_all(conn, settlements, now)

        applied = await self._transact(work)
        self._wake()
        return applied

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
        settlements = list(settlements)
        slots = ClaimSlots.of(queues, limit)
        lapsed_before = _lapsed_before(self.now(), rescue)

        def work(conn: sqlite3.Connection, now: float) -> tuple[list[JobId], list[Claim]]:
            # One transaction, one trip through the thread door and one commit where there
            # were two of each: the settles first, in order, as settle() applies them.
            applied = _settle_all(conn, settlements, now)
            claims = _claim_in(
                conn, now, slots, lease, worker_id, free, lapsed_before=lapsed_before
            )
            return applied, claims

        answers = await self._transact(work)
        self._wake()
        return answers

    async def save_step(
        self, lease: Lease, step: StepRecord, *, connection: object | None = None
    ) -> bool:
        conn, tx = unwrap(connection)

        def work(conn: sqlite3.Connection, now: float) -> bool:
            cursor = conn.execute(
                f"INSERT INTO steps (job_id, {_STEP_COLUMNS})"
                " SELECT ?, ?, ?, ?, ?, ?, ?, ?, ?"
                f" WHERE EXISTS (SELECT 1 FROM jobs WHERE {_FENCE})"
                " ON CONFLICT (job_id, name) DO UPDATE SET status = excluded.status,"
                " started_at = excluded.started_at, finished_at = excluded.finished_at,"
                " result = excluded.result, wake_at = excluded.wake_at,"
                " event = excluded.event, match = excluded.match",
                (
                    lease.job_id,
                    step.name,
                    step.status.value,
                    step.started_at,
                    step.finished_at,
                    step.result,
                    step.wake_at,
                    step.event,
                    step.match,
                    lease.job_id,
                    lease.token,
                ),
            )
            return cursor.rowcount == 1

        if conn is not None:
            # In the caller's transaction (step.transaction): it holds the file's write lock
            # from its BEGIN IMMEDIATE to its end, so no claim of another process can change
            # the token between this check and the commit that lands the step's effects.
            return await self._on_callers(conn, tx, work, wake=False)
        return await self._transact(work)

    async def load_steps(self, job_id: JobId) -> Sequence[StepRecord]:
        def work(conn: sqlite3.Connection, now: float) -> list[StepRecord]:
            # rowid order: the order steps were first saved (an upsert keeps the row's rowid).
            rows = conn.execute(
                f"SELECT {_STEP_COLUMNS} FROM steps WHERE job_id = ? ORDER BY rowid", (job_id,)
            )
            return [_step(row) for row in rows]

        return await self._transact(work, mode="read")

    # Reads and operator actions.

    async def get(self, job_id: JobId) -> JobRecord | None:
        def work(conn: sqlite3.Connection, now: float) -> JobRecord | None:
            row = conn.execute(f"SELECT {JOB_COLUMNS} FROM jobs WHERE id = ?", (job_id,))
            found = row.fetchone()
            return None if found is None else job_record(found)

        return await self._transact(work, mode="read")

    async def list_jobs(
        self,
        *,
        state: JobState | None = None,
        queue: str | None = None,
        name: str | None = None,
        changed_before: float | None = None,
        limit: int = 100,
    ) -> Sequence[JobRecord]:
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

    async def pause_queue(self, queue: str, *, by: str | None = None) -> QueuePause:
        def work(conn: sqlite3.Connection, now: float) -> QueuePause:
            row = conn.execute(
                "SELECT queue, paused_at, paused_by, coalesce(epoch, 0) FROM queue_pauses"
                " WHERE queue = ?",
                (queue,),
            ).fetchone()
            if row is not None:
                return QueuePause(*row)
            pause = QueuePause(queue, now, by, _next_pause_epoch(conn))
            conn.execute(
                "INSERT INTO queue_pauses (queue, paused_at, paused_by, epoch) VALUES (?, ?, ?, ?)",
                (queue, now, by, pause.epoch),
            )
            return pause

        pause = await self._transact(work)
        self._pause_changed()
        return pause

    async def resume_queue(self, queue: str) -> bool:
        def work(conn: sqlite3.Connection, now: float) -> bool:
            gone = conn.execute(
                "DELETE FROM queue_pauses WHERE queue = ? RETURNING queue", (queue,)
            ).fetchone()
            if gone is not None:
                _next_pause_epoch(conn)
            return gone is not None

        resumed = await self._transact(work)
        self._pause_changed()
        self._wake()  # its jobs are work again
        return resumed

    async def queue_pauses(self) -> Sequence[QueuePause]:
        def work(conn: sqlite3.Connection, now: float) -> list[QueuePause]:
            return _pauses(conn)

        return await self._transact(work, mode="read")

    async def _pause_look(self) -> PauseLook:
        def work(conn: sqlite3.Connection, now: float) -> PauseLook:
            # One read transaction: the epoch and the pauses of one state of the file.
            (epoch,) = conn.execute("SELECT epoch FROM pause_epoch WHERE id = 1").fetchone()
            return PauseLook(epoch, tuple(_pauses(conn)))

        return await self._transact(work, mode="read")

    async def wait_for_pauses(self, seen: int | None, timeout: float) -> PauseLook:
        """Another process's pause is seen at the next look, every ``poll_interval``, as its
        enqueues are (wait_for_work); this driver's own wake this process's waiters at once."""
        deadline = trio.current_time() + timeout
        while True:
            changes = self._pause_changes
            look = await self._pause_look()
            now = trio.current_time()
            if look.epoch != seen or now >= deadline:
                return look
            if self._pause_changes != changes:
                continue  # a pause of this driver's landed during the look: look again
            with trio.move_on_at(min(deadline, now + self._poll_interval)):
                await self._pause_lot.park()

    async def pauses_heard(self, worker_id: str, epoch: int) -> None:
        def work(conn: sqlite3.Connection, now: float) -> None:
            conn.execute(
                "INSERT OR REPLACE INTO pauses_heard (worker_id, epoch, heard_at) VALUES (?, ?, ?)",
                (worker_id, epoch, now),
            )
            conn.execute(
                "DELETE FROM pauses_heard WHERE heard_at < ?", (now - FORGET_WORKERS_AFTER,)
            )

        await self._transact(work)

    async def pause_holders(self, queue: str) -> Sequence[PauseHolder]:
        def work(conn: sqlite3.Connection, now: float) -> list[PauseHolder]:
            rows = conn.execute(
                "SELECT j.worker_id, count(*), max(coalesce(j.lease_until, 0)), h.epoch"
                " FROM jobs AS j LEFT JOIN pauses_heard AS h ON h.worker_id = j.worker_id"
                " WHERE j.queue = ? AND j.state = 'running' AND j.worker_id IS NOT NULL"
                " GROUP BY j.worker_id ORDER BY j.worker_id",
                (queue,),
            )
            return [PauseHolder(*row) for row in rows]

        return await self._transact(work, mode="read")

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

    # Wake-ups.

    async def wait_for_work(
        self, queues: Sequence[str], timeout: float, *, rescue_from: float | None = None
    ) -> None:
        """No cross-process notification exists in SQLite: this driver's own writes wake a
        waiter at once; another process's are seen at the next look, every ``poll_interval``."""
        wanted = list(dict.fromkeys(queues))
        lapses_from = -math.inf if rescue_from is None else rescue_from

        def work(conn: sqlite3.Connection, now: float) -> float:
            soonest = math.inf
            paused = _paused(conn)  # a paused queue's jobs are no work
            # INDEXED BY: the lease look reads the queue's running rows, never the table (what
            # SQLite picks once ANALYZE has seen a queue of ready jobs, as in claim()).
            for queue in wanted:
                if queue in paused:
                    continue
                for sql, not_before in (
                    (
                        "SELECT min(run_at) FROM jobs INDEXED BY jobs_next_due"
                        " WHERE queue = ? AND state = 'ready'",
                        -math.inf,
                    ),
                    (
                        "SELECT min(run_at) FROM jobs INDEXED BY jobs_next_due"
                        " WHERE queue = ? AND state = 'suspended'",
                        -math.inf,
                    ),
                    (
                        "SELECT min(lease_until) FROM jobs INDEXED BY jobs_next_due"
                        " WHERE queue = ? AND state = 'running'",
                        lapses_from,
                    ),
                ):
                    (when,) = conn.execute(sql, (queue,)).fetchone()
                    if when is not None:
                        soonest = min(soonest, max(when, not_before) - now)
            return soonest

        wakes = self._wakes
        due_in = await self._transact(work, mode="read")
        if due_in <= 0 or self._wakes != wakes:
            return
        with trio.move_on_after(min(timeout, due_in, self._poll_interval)):
            await self._lot.park()

    # Events.

    async def send_event(
        self, name: str, payload: str, *, key: str | None = None, connection: object | None = None
    ) -> str:
        json.loads(payload)  # the boundary checked it; a driver never stores what it cannot read
        conn, tx = unwrap(connection)

        def work(conn: sqlite3.Connection, now: float) -> str:
            return store_event(conn, name, payload, key, now)

        if conn is not None:
            # In the caller's transaction, as an enqueue is: the order row, its job and the
            # event a waiting workflow needs land together, and the wake-up waits for the commit.
            return await self._on_callers(conn, tx, work, wake=True)
        event_id = await self._transact(work)
        self._wake()
        return event_id

    async def look_for_event(self, name: str, *, key: str | None, since: float | None) -> EventLook:
        where, values = ["name = ?"], list[object]([name])
        if key is not None:
            where.append("key = ?")
            values.append(key)
        if since is not None:
            where.append("created_at >= ?")
            values.append(since)

        def work(conn: sqlite3.Connection, now: float) -> EventLook:
            # One read transaction, one snapshot: the mark covers every event the look read.
            (newest,) = conn.execute(
                "SELECT max(id) FROM events WHERE name = ?", (name,)
            ).fetchone()
            row = conn.execute(
                f"SELECT {_EVENT_COLUMNS} FROM events WHERE {' AND '.join(where)}"
                " ORDER BY id LIMIT 1",
                values,
            ).fetchone()
            return EventLook(None if row is None else _event(row), event_mark(newest))

        return await self._transact(work, mode="read")

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

    # The caller's transaction.

    @contextlib.asynccontextmanager
    async def open_transaction(self) -> AsyncIterator[Transaction]:
        """A transaction on the driver's own connection, for ``jobs_trio.transaction(driver)``:
        the application's SQL (``tx.execute``) and the jobs it enqueues commit together. Every
        other call of this driver waits for the block to end, as SQLite has one writer: keep
        the block short."""
        async with self._door.held() as conn:
            ops = SqliteOps(conn, limiter=self._door.threads, busy_timeout=self._door.busy_timeout)
            async with owned(Transaction(conn, ops)) as tx:
                yield tx

    async def _on_callers(
        self, connection: object, tx: Transaction | None, work: Work[T], *, wake: bool
    ) -> T:
        """Run ``work`` on the caller's connection, inside its transaction (a savepoint, so a
        failure here undoes only these writes), or in one of its own when it has none."""
        if not isinstance(connection, sqlite3.Connection):
            raise ConfigError(
                f"connection= must be a sqlite3 connection to {self.path!r}, not"
                f" {type(connection).__name__}",
                fix="pass the sqlite3 connection your transaction runs on, or open the"
                " transaction with jobs_trio.transaction(conn)",
            )
        own = connection is self._conn
        now = self.now()

        def run() -> T:
            if not own:
                refuse_another_file(connection, self.path)
            return write_in(connection, lambda conn: work(conn, now))

        try:
            # The driver's own connection (jobs_trio.transaction(driver)) keeps to the driver's
            # one thread token; an application's connection is the application's to pace. In a
            # block, one statement at a time: a savepoint's writes must not interleave another
            # task's statements of the same block.
            async with contextlib.nullcontext() if tx is None else tx.lock:
                answer = await trio.to_thread.run_sync(
                    run, limiter=self._door.threads if own else None
                )
        except Exception as exc:
            mapped = caller_error(self.path, exc)
            if mapped is None:
                raise
            raise mapped from exc
        if wake:
            if tx is not None and tx.owned:
                # After the commit, not now: a worker woken before it finds nothing to claim.
                tx.after_commit(self._wake)
            else:
                self._wake()
        return answer

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

    async def worker_seen(self, presence: WorkerPresence) -> None:
        row = {
            **attrs.asdict(presence, recurse=False),
            "queues": json.dumps(presence.queues),
            "jobs": encode_jobs(presence.jobs),
        }

        def work(conn: sqlite3.Connection, now: float) -> None:
            conn.execute(
                f"INSERT OR REPLACE INTO workers ({_WORKER_COLUMNS})"
                f" VALUES ({', '.join('?' for _ in _WORKER_FIELDS)})",
                tuple(row[field] for field in _WORKER_FIELDS),
            )
            conn.execute("DELETE FROM workers WHERE seen_at < ?", (now - FORGET_WORKERS_AFTER,))

        await self._transact(work)

    async def worker_gone(self, worker_id: str) -> None:
        def work(conn: sqlite3.Connection, now: float) -> None:
            conn.execute("DELETE FROM workers WHERE worker_id = ?", (worker_id,))

        await self._transact(work)

    async def workers(self) -> Sequence[WorkerPresence]:
        def work(conn: sqlite3.Connection, now: float) -> list[WorkerPresence]:
            rows = conn.execute(f"SELECT {_WORKER_COLUMNS} FROM workers ORDER BY worker_id")
            return [_presence(row) for row in rows]

        return await self._transact(work, mode="read")

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

    async def relay_enqueue(
        self,
        jobs: Sequence[NewJob],
        *,
        source: str,
        ticket: str,
        superseded: Sequence[str] = (),
    ) -> Sequence[RelayDecision]:
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
        if not isinstance(outbox, SqliteDriver):
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

    async def aclose(self) -> None:
        if self._door.closed:
            return
        self._wake()  # a waiter's next call hears the door is closed (before any checkpoint)
        self._pause_changed()
        await self._door.aclose()


@contextlib.asynccontextmanager
async def open_sqlite_driver(
    url: str,
    *,
    clock: Callable[[], float] = time.time,
    busy_timeout: float = 5.0,
    poll_interval: float = POLL_INTERVAL,
    synchronous: str = "FULL",
    read_only: bool = False,
    create: bool = True,
    migrate: bool = False,
) -> AsyncIterator[SqliteDriver]:
    """Open ``sqlite:///jobs.db``: create or upgrade the schema, switch to WAL, and close the
    connection on the way out. A new file is created readable by its owner only (0600).
    ``migrate`` changes nothing (every open to write migrates) and is taken so that one set of
    options serves every URL; with ``read_only=True`` it is refused (that open never migrates).

    ``read_only=True`` creates, upgrades and changes nothing: a missing file is "no database
    at PATH", a file at an older schema version is refused, and every write is refused by
    SQLite itself (`ConfigError`, never a retry). ``create=False`` opens to write, but only a
    file that is already there (an operator's retry or cancel of a job that must exist).

    ``busy_timeout`` is how long a call waits for another connection's write lock before a few
    last tries and then `DriverError`. ``synchronous`` is FULL (a committed job survives a power
    cut) unless you choose NORMAL (faster; survives a crash of the process, not of the OS).
    """
    if migrate and read_only:
        raise ConfigError(
            "migrate=True and read_only=True were both given: a read-only open never migrates",
            fix="drop read_only to migrate the file (every open to write does), or drop migrate",
        )
    async with open_sqlite_file(
        url,
        clock=clock,
        busy_timeout=busy_timeout,
        synchronous=synchronous,
        read_only=read_only,
        create=create,
    ) as door:
        driver = SqliteDriver(door, url=url, poll_interval=poll_interval)
        try:
            yield driver
        finally:
            await driver.aclose()


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
