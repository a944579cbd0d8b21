# The SQLite driver's settle statements: each ending written under its claim's token, in batches,
# with the attempt's history row. Apart from _jobs.py because a batch's writing is its own craft.
from __future__ import annotations

import json
import operator
import sqlite3
from collections.abc import Sequence
from typing import Final

from ..._core.operator_transitions import cancel_instead
from ..._core.records import Complete, JobId, Settlement
from .._limit_rules import SLOT, waiting_on
from .._rules import (
    ATTEMPT_HISTORY,
    WAITING_STATES_SQL,
    Effect,
    Unseen,
    effect,
    history_record,
    woken,
)
from ._connection import _ATTEMPT_COLUMNS, _ATTEMPT_FIELDS, _FENCE

# One attempt's history record (_history_row's values).
_INSERT_HISTORY: Final = (
    f"INSERT OR REPLACE INTO attempts (job_id, slot, {_ATTEMPT_COLUMNS})"
    f" VALUES (?, ?, {', '.join('?' for _ in _ATTEMPT_FIELDS)})"
)


# A record's values in _ATTEMPT_FIELDS' order, read in C: attrs.astuple's general walk was a
# tenth of a settle's work in the driver's thread, which the worker's loop waits on (issue 35).
_attempt_values = operator.attrgetter(*_ATTEMPT_FIELDS)


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
        note = s.note
        if note is not None:
            # _history_row's row for a completion, made here: no Effect nor AttemptRecord per
            # job in the driver's thread, whose Python holds the GIL the worker's loop needs
            # (issue 44). A completion stores no error, and stands against a pending cancel. In
            # _ATTEMPT_FIELDS' order (the conformance suite's batch of completions checks it).
            seq = row[2]
            history.append(
                (
                    s.lease.job_id,
                    seq % ATTEMPT_HISTORY,
                    seq,
                    note.attempt,
                    "completed",
                    note.worker_id,
                    now,
                    note.seconds,
                    None,
                    note.traceback,
                )
            )
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
        f" worker_id = NULL, cancel_requested = 0, token = NULL, alone = 0, updated_at = ?,"
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
