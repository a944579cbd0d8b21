# The SQLite driver's jobs: enqueue, claim (fleet limits, claims ahead), renew, settle, wake-ups.
# Apart because it is the path every job takes; the other capabilities only read or nudge it.
from __future__ import annotations

import functools
import json
import math
import operator
import os
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
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
from .._gil_handoff import DoorConnection
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
from .._sqlite_door import Work, moved_error, moved_from
from .._sqlite_enqueue import insert_jobs
from .._sqlite_migrate import open_beside
from .._transaction import unwrap
from ..contract import BesideConnection
from ._connection import SqliteConnection, T, _paused, data_version
from ._settle_statements import (
    _INSERT_HISTORY,
    NotAllApplied,
    SettlePlan,
    _attempt_values,
    _settle_all,
    release_slot,
    settle_planned,
)

# What a claim reads back of each job it took, in Claim's order (both claim paths).
_CLAIMED: Final = "id, token, name, queue, payload, attempts, max_attempts, context, run_at, alone"
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
    settled: str | None = None,
) -> Taken:
    """The claim, inside the caller's transaction (claim, and settle_and_claim after its
    settles: a job settled there is no longer running, so never a lapsed one; one retried at
    once is ready, and may be claimed as any ready job would be). Nothing of a paused queue is
    claimed, lapsed or not. ``settled``: the completions a settle just wrote with
    ``slots_after`` (their JSON), whose fleet slots the claim frees. Its Claims are made on the
    Trio side (`Taken.claims`)."""
    lease_until = now + lease
    lapsed_at = min(now, lapsed_before) if lapsed_before != -math.inf else None

    def look(suspects: bool) -> tuple[str, bool]:
        # What the claim's first look finds to do first (rarely anything): the fleet slots the
        # completions just settled hold, freed (settle_planned(slots_after=True)), and the
        # lapsed leases handed back; then it looks again.
        nonlocal lapsed_at, settled
        lapsed, found, unusual, held = _look(conn, slots.caps, now, lapsed_at, settled, suspects)
        if lapsed or held != "[]":
            for token in json.loads(held):
                release_slot(conn, token, now)
            if lapsed:
                _release_all_lapsed(conn, slots, lapsed_at, now)
            _, found, unusual, _ = _look(conn, slots.caps, now, None, None, suspects)
        lapsed_at = settled = None
        return found, unusual

    if alone:
        # The due suspects first, off their own index (a handful): the first one alone.
        found, _ = look(suspects=True)
        rows = _ranked(found)[:1]
        if rows:
            return _take_rows(conn, now, lease_until, slots, worker_id, free, rows)
    found, unusual = look(suspects=False)
    if found == "[]":
        return Taken(lease_until)
    if len(slots.caps) == 1 and not unusual:
        # The common claim, taken by rank from the look's own text: the thread runs no Python
        # between the two statements, which the worker's loop would wait for (issue 44).
        ((queue, total),) = slots.caps.items()  # one queue: its cap is the claim's total
        run_at_once = total if free is None else free.get(queue, 0)  # ranks past it: ahead
        # A token for each rank it may take: no more than the rows found, which a limit far
        # past them (10**7: a second and 360 MB of random bytes) must not cost. Counted
        # without parsing the text: every boundary between two rows is "],[" (a row's own
        # text may hold more), so this bounds the rows from above.
        tokens = os.urandom(12 * min(total, found.count("],[") + 1)).hex()
        conn.execute(_TAKE_RANKED, (lease_until, worker_id, now, found, run_at_once, tokens, total))
        return Taken.ranked(lease_until, found, tokens, run_at_once, total)
    return _take_rows(conn, now, lease_until, slots, worker_id, free, _ranked(found))


def _take_rows(
    conn: sqlite3.Connection,
    now: float,
    lease_until: float,
    slots: ClaimSlots,
    worker_id: str,
    free: Mapping[str, int] | None,
    rows: list[list[Any]],
) -> Taken:
    """The claim's general case: several queues, jobs with fleet limits or long payloads, a
    suspect."""
    if len(slots.caps) == 1:
        taken = rows[: slots.total]  # one queue: its cap is the claim's total (ClaimSlots.of)
    else:
        taken = slots.take((row[_QUEUE_AT], row) for row in rows)
    if not taken:
        return Taken(lease_until)
    long = {row[_ID_AT]: row for row in taken if row[_PAYLOAD_AT] is None}
    if long:  # past INLINE_PAYLOAD: each read on its own
        for job_id, payload in conn.execute(
            "SELECT id, payload FROM jobs WHERE id IN (SELECT value FROM json_each(?))",
            (json.dumps(list(long)),),
        ):
            long[job_id][_PAYLOAD_AT] = payload
    ahead = {row[_ID_AT] for row in slots.ahead(((row[_QUEUE_AT], row) for row in taken), free)}
    limited = [row for row in taken if row[_LIMITED_AT]]
    granted: dict[str, Any] = {}
    if limited:
        # Jobs with fleet limits: the shared rule decides them (_limit_rules.py), and none is
        # marked ahead.
        ids = [row[_ID_AT] for row in limited]
        granted = _claim_limited(conn, ids, now, lease_until - now, worker_id)
        ahead.difference_update(ids)
        taken = [row for row in taken if not row[_LIMITED_AT] or row[_ID_AT] in granted]
    unlimited = [row[_ID_AT] for row in taken if not row[_LIMITED_AT]]
    tokens = os.urandom(12 * len(unlimited)).hex()
    if unlimited:
        # One UPDATE for the batch, each row its fresh token. A suspect is only ever taken
        # alone (above), so it runs alone: marked, for the rescue that may find it lapsed.
        conn.execute(
            _TAKE,
            (lease_until, worker_id, now, json.dumps(unlimited), json.dumps(list(ahead)), tokens),
        )
    return Taken(lease_until, taken, tokens, ahead, granted)


def _ranked(found: str) -> list[list[Any]]:
    """The look's rows, in claim order."""
    rows: list[list[Any]] = json.loads(found)
    rows.sort(key=_RANK)
    return rows


class Taken:
    """What a claim took, as the door's thread read it. Its Claims are made on the Trio side
    (`claims`): the worker's loop makes them itself, where in the thread it waited for them
    (issue 44: the thread's Python holds the GIL the loop needs)."""

    __slots__ = ("_ahead", "_granted", "_lease_until", "_ranked", "_rows", "_tokens")

    def __init__(
        self,
        lease_until: float,
        rows: Sequence[list[Any]] = (),
        tokens: str = "",
        ahead: AbstractSet[str] = frozenset(),
        granted: Mapping[str, Any] | None = None,
    ) -> None:
        self._lease_until = lease_until
        self._rows = rows  # the candidates taken, in claim order (_CANDIDATE)
        self._tokens = tokens  # the unlimited ones' tokens, 24 hex digits each, in order
        self._ahead = ahead
        self._granted = granted or {}  # the limited ones, as _claim_limited's UPDATE returned
        self._ranked: tuple[str, int, int] | None = None

    @classmethod
    def ranked(
        cls, lease_until: float, found: str, tokens: str, run_at_once: int, total: int
    ) -> Taken:
        """_TAKE_RANKED's claim: the look's text, and the ranks it took (up to ``total``;
        those past ``run_at_once`` ahead)."""
        taken = cls(lease_until, tokens=tokens)
        taken._ranked = (found, run_at_once, total)
        return taken

    def claims(self) -> list[Claim]:
        """In claim order; each by position in Claim's field order."""
        rows, ahead = self._rows, self._ahead
        if self._ranked is not None:
            found, run_at_once, total = self._ranked
            rows = _ranked(found)[:total]
            ahead = {row[_ID_AT] for row in rows[run_at_once:]}
        lease_until, tokens, granted = self._lease_until, self._tokens, self._granted
        claims = []
        k = 0
        for row in rows:
            job_id = row[_ID_AT]
            got = granted.get(job_id)
            if got is not None:  # _CLAIMED's columns
                token, name, queue, payload, attempt, max_attempts = got[1:7]
                claims.append(
                    Claim(
                        job_id,
                        token,
                        name,
                        queue,
                        payload,
                        attempt,
                        max_attempts,
                        lease_until,
                        got[7],  # context
                        False,  # never ahead
                        got[8],  # due_at
                        bool(got[9]),  # alone
                    )
                )
                continue
            claims.append(
                Claim(
                    job_id,
                    tokens[k : k + 24],
                    row[8],  # name
                    row[6],  # queue
                    row[9],  # payload
                    row[4] + 1,  # attempt
                    row[5],  # max_attempts
                    lease_until,
                    row[10],  # context
                    job_id in ahead,
                    float(row[1]),  # due_at
                    bool(row[11]),  # alone: a suspect
                )
            )
            k += 24
        return claims


def _release_all_lapsed(
    conn: sqlite3.Connection, slots: ClaimSlots, lapsed_at: float | None, now: float
) -> None:
    assert lapsed_at is not None
    paused = _paused(conn)  # a paused queue's lapsed jobs wait for its resume
    asked = {queue: cap for queue, cap in slots.caps.items() if queue not in paused}
    _release_lapsed(conn, asked, lapsed_at, slots.total, now)


# The longest payload a look carries in its text (characters); a longer one is null there and
# read on its own (_take_rows): a look of 512 payloads of 256 MiB would pass SQLite's limit on
# one value (1 GB), and the text of a claim's batch stays a few MiB at most.
INLINE_PAYLOAD: Final = 8192


# A claim's look, for every queue and waiting state at once, in one statement and one JSON
# text: one step of SQLite's, where a row each was a step each, and at each the driver's thread
# had to take the GIL back from the worker's loop (issue 44). Each read stops after its queue's
# cap in claim order (the jobs_claim index; suspects off theirs) and the rows are ranked in
# claim order across reads, so Python's sort by rank gives the memory driver's order to the
# letter. INDEXED BY: left to itself SQLite picks jobs_next_due (it also matches run_at) and
# sorts every due row before the LIMIT: 3.8 ms a claim at 20,000 queued, against 0.04 ms
# reading jobs_claim in order. A row: priority, run_at (text of 17 digits: SQLite's JSON writes
# a REAL with 15, which loses the last ones), id, state, attempts, max_attempts, queue, limited,
# name, payload (null past INLINE_PAYLOAD), context, suspect, rank.
_CANDIDATE: Final = (
    "priority, printf('%!.17g', run_at), id, state, attempts, max_attempts, queue,"
    " slot_key IS NOT NULL OR rate_key IS NOT NULL, name,"
    f" CASE WHEN length(payload) <= {INLINE_PAYLOAD} THEN payload END, context, {_SUSPECT},"
    f" run_at, length(payload) > {INLINE_PAYLOAD}"
)
_ID_AT: Final = 2
_QUEUE_AT: Final = 6
_LIMITED_AT: Final = 7
_PAYLOAD_AT: Final = 9
_RANK_AT: Final = 12
_RANK = operator.itemgetter(_RANK_AT)
# The queues one look reads: SQLite compounds at most 500 SELECTs in a statement
# (SQLITE_MAX_COMPOUND_SELECT) and a look reads each queue twice (its waiting states), so a
# claim over more queues looks in parts (a worker of 300 queues failed every claim).
_LOOK_QUEUES_AT_MOST: Final = 100
_NOT_PAUSED: Final = "NOT EXISTS (SELECT 1 FROM queue_pauses WHERE queue_pauses.queue = ?{n})"


@functools.cache  # a handful of shapes a worker, each built once, not once a claim
def _look_sql(queues: int, suspects: bool, lapsed: bool, settled: bool) -> str:
    """_look's statement: ``queues`` queues' reads (parameters: queue, now, cap, lapsed_at),
    then the settled completions' JSON if ``settled``."""
    index, which = ("jobs_suspects", "") if suspects else ("jobs_claim", "NOT ")
    reads, lapses = [], []
    each = 4 if lapsed else 3  # parameters of a queue: SQLite counts the highest one named
    for k in range(queues):
        queue, now, cap, lapsed_at = (each * k + n for n in range(1, 5))
        for state in WAITING_STATES:
            reads.append(
                f"SELECT * FROM (SELECT {_CANDIDATE} FROM jobs INDEXED BY {index}"
                f" WHERE queue = ?{queue} AND state = '{state.value}' AND run_at <= ?{now}"
                f" AND {which}{_SUSPECT} AND {_NOT_PAUSED.format(n=queue)}"
                f" ORDER BY priority, run_at, id LIMIT ?{cap})"
            )
        # INDEXED BY: once ANALYZE has run on a queue of ready jobs, its statistics say
        # `state = 'running'` matches every row, and SQLite scans the whole table instead
        # (_release_lapsed).
        if lapsed:
            lapses.append(
                f"EXISTS (SELECT 1 FROM jobs INDEXED BY jobs_next_due WHERE queue = ?{queue}"
                f" AND state = 'running' AND lease_until <= ?{lapsed_at}"
                f" AND {_NOT_PAUSED.format(n=queue)})"
            )
    columns = ", ".join(f"c{k}" for k in range(14))
    shown = ", ".join(f"c{k}" for k in range(12))
    return (
        f"WITH c({columns}) AS ({' UNION ALL '.join(reads)})"
        f" SELECT {' OR '.join(lapses) if lapsed else '0'},"
        f" (SELECT json_group_array(json_array({shown}, r)) FROM"
        " (SELECT *, row_number() OVER (ORDER BY c0, c12, c2) AS r FROM c)),"
        " EXISTS (SELECT 1 FROM c WHERE c7 OR c13),"
        + (
            " (SELECT json_group_array(token) FROM limit_rows WHERE kind = 'slot' AND token IN"
            f" (SELECT json_extract(value, '$[1]') FROM json_each(?{each * queues + 1})))"
            if settled
            else " '[]'"
        )
    )


def _look(
    conn: sqlite3.Connection,
    caps: Mapping[str, int],
    now: float,
    lapsed_at: float | None,
    settled: str | None,
    suspects: bool,
) -> tuple[bool, str, bool, str]:
    """Whether a job of ``caps``' queues has a lease lapsed by ``lapsed_at`` (never when
    None); each queue's waiting jobs due by ``now`` (``suspects``: its due suspects, one
    each), as _CANDIDATE's rows in a JSON text (`_ranked` reads it); whether any of them has
    fleet limits or a payload past INLINE_PAYLOAD (the claim's general case); and the tokens
    of the ``settled`` completions that hold a fleet slot, as a JSON text."""
    if not caps:
        return False, "[]", False, "[]"
    if len(caps) > _LOOK_QUEUES_AT_MOST:
        # A look a part, their rows ranked again as one look ranks them (priority, run-at, id:
        # the run-at's 17 digits give back its REAL exactly), the settled completions' slots
        # read by the first part alone.
        parts = list(caps.items())
        lapsed = unusual = False
        held = "[]"
        rows: list[list[Any]] = []
        for start in range(0, len(parts), _LOOK_QUEUES_AT_MOST):
            part = dict(parts[start : start + _LOOK_QUEUES_AT_MOST])
            part_lapsed, found, part_unusual, part_held = _look(
                conn, part, now, lapsed_at, settled if start == 0 else None, suspects
            )
            lapsed, unusual = lapsed or part_lapsed, unusual or part_unusual
            if start == 0:
                held = part_held
            rows += json.loads(found)
        rows.sort(key=lambda row: (row[0], float(row[1]), row[_ID_AT]))
        for rank, row in enumerate(rows, 1):
            row[_RANK_AT] = rank
        return lapsed, json.dumps(rows) if rows else "[]", unusual, held
    params: list[Any] = []
    for queue, cap in caps.items():
        params += (queue, now, 1 if suspects else cap)
        if lapsed_at is not None:
            params.append(lapsed_at)
    if settled is not None:
        params.append(settled)
    sql = _look_sql(len(caps), suspects, lapsed_at is not None, settled is not None)
    lapsed, found, unusual, held = conn.execute(sql, params).fetchone()
    return bool(lapsed), found, bool(unusual), held


# Claiming the common batch (_claim_in): from the look's text, the ranks up to its total (?7),
# those past the ones run at once (?5) ahead, each the token at its rank (?6).
_TAKE_RANKED: Final = (
    "UPDATE jobs SET state = 'running', lease_until = ?1, attempts = attempts + 1,"
    " ahead = (json_extract(u.value, '$[12]') > ?5),"
    f" alone = {_SUSPECT}, worker_id = ?2,"
    " token = substr(?6, json_extract(u.value, '$[12]') * 24 - 23, 24),"
    " wait_event = NULL, wait_key = NULL, updated_at = ?3"
    " FROM json_each(?4) AS u WHERE jobs.id = json_extract(u.value, '$[2]')"
    " AND json_extract(u.value, '$[12]') <= ?7"
)
# Claiming the batch: its ids in claim order, those of them taken ahead, and their tokens.
_TAKE: Final = (
    "UPDATE jobs SET state = 'running', lease_until = ?1, attempts = attempts + 1,"
    " ahead = (jobs.id IN (SELECT value FROM json_each(?5))),"
    f" alone = {_SUSPECT}, worker_id = ?2, token = substr(?6, u.key * 24 + 1, 24),"
    " wait_event = NULL, wait_key = NULL, updated_at = ?3"
    " FROM json_each(?4) AS u WHERE jobs.id = u.value"
)


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
    waiting out another writer for up to ``busy_timeout`` there (this thread may block). It
    opens the file the driver's connection opened (``opened``: its absolute path and identity),
    never another: opened by a relative path after a job body's chdir, it found no database
    and renewed nothing; after the file was replaced, it renewed leases in the new one."""

    def __init__(
        self,
        path: str,
        opened: tuple[str, tuple[int, int]] | None,
        busy_timeout: float,
        clock: Callable[[], float],
    ) -> None:
        self._path = path if opened is None else opened[0]
        self._opened = opened
        self._busy_timeout = busy_timeout
        self._clock = clock
        self._conn: sqlite3.Connection | None = None

    def renew(self, leases: Sequence[Lease], *, lease: float) -> frozenset[ClaimToken]:
        return self._write(lambda conn, now: _renew_in(conn, now, leases, lease, ()).held)

    def settle(self, settlements: Sequence[Settlement]) -> Sequence[JobId]:
        return self._write(lambda conn, now: _settle_all(conn, settlements, now))

    def _write(self, work: Work[T]) -> T:
        moved = moved_from(self._opened)
        if moved is not None:
            raise moved_error(moved)
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

        def work(conn: sqlite3.Connection, now: float) -> Taken:
            return _claim_in(
                conn, now, slots, lease, worker_id, free, lapsed_before=lapsed_before, alone=alone
            )

        taken = await self._transact(work)
        return taken.claims()

    # Writes of a run, fenced by its lease.

    async def renew(
        self, leases: Sequence[Lease], *, lease: float, started: Sequence[ClaimToken] = ()
    ) -> RenewResult:
        def work(conn: sqlite3.Connection, now: float) -> RenewResult:
            return _renew_in(conn, now, leases, lease, started)

        return await self._transact(work)

    def beside(self) -> BesideConnection:
        conn = self._door.conn
        opened = conn.opened if isinstance(conn, DoorConnection) else None
        return _SqliteBeside(self.path, opened, self._door.busy_timeout, self.now)

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
        plan = SettlePlan(settlements)

        def work(conn: sqlite3.Connection, now: float) -> list[JobId]:
            # In order, one transaction: a second settlement of the same lease in the batch
            # finds the token already cleared and applies nothing, as it would in two calls.
            return settle_planned(conn, plan, now)

        applied = await self._transact(work)
        self._wake()
        return applied

    async def _settle_and_claim(
        self, settlements: Sequence[Settlement], ask: ClaimAsk
    ) -> tuple[Sequence[JobId], Sequence[Claim]]:
        queues, limit, lease, worker_id, free, rescue = ask.parts()
        alone = ask.alone
        plan = SettlePlan(settlements)
        slots = ClaimSlots.of(queues, limit)
        lapsed_before = _lapsed_before(self.now(), rescue)

        def work(
            conn: sqlite3.Connection, now: float, checked: bool = False
        ) -> tuple[list[JobId], Taken]:
            # One transaction, one trip through the thread door and one commit where there
            # were two of each: the settles first, in order, as settle() applies them. The
            # completions' fleet slots are freed by the claim's look (one statement fewer),
            # where a look runs: a claim that asks for nothing looks at nothing, and a slot
            # left to it stayed held until its lease ran out.
            later = not checked and bool(slots.caps)
            applied = settle_planned(conn, plan, now, slots_after=later)
            taken = _claim_in(
                conn,
                now,
                slots,
                lease,
                worker_id,
                free,
                lapsed_before=lapsed_before,
                alone=alone,
                settled=plan.together if later else None,
            )
            return applied, taken

        try:
            applied, taken = await self._transact(work)
        except NotAllApplied:
            # A completion's lease no longer held (rolled back: nothing was written). Again,
            # with each completion's lease looked at.
            applied, taken = await self._transact(functools.partial(work, checked=True))
        self._wake()
        return applied, taken.claims()

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
