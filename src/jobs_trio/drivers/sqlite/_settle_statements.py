# The SQLite driver's settle statements: each ending written under its claim's token, in batches,
# with the attempt's history row. Apart from _jobs.py because a batch's writing is its own craft.
from __future__ import annotations

import json
import math
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


class SettlePlan:
    """A batch of settlements made ready on the Trio side for the door's thread
    (`settle_planned`): its completions written together already as JSON, so that the thread,
    whose Python the worker's loop waits for (issue 44), only runs statements."""

    __slots__ = ("ids", "one_by_one", "settlements", "together", "together_ids")

    def __init__(self, settlements: Sequence[Settlement]) -> None:
        self.settlements = list(settlements)
        self.ids = [s.lease.job_id for s in self.settlements]
        # Where a job is settled twice, every one is written in its turn.
        self.one_by_one = len(set(self.ids)) < len(self.ids)
        self.together: str | None = None  # _complete_all's JSON
        self.together_ids: list[JobId] = []
        if self.one_by_one:
            return
        completes = [s for s in self.settlements if type(s) is Complete]
        text = _together_json(completes)
        if text is None and len(completes) >= 2:
            completes = [s for s in completes if _together(s)]
            text = _together_json(completes)
        if text is not None:
            self.together = text
            self.together_ids = [s.lease.job_id for s in completes]


def _settle_all(
    conn: sqlite3.Connection, settlements: Sequence[Settlement], now: float
) -> list[JobId]:
    """``settlements`` in order, in the caller's transaction (`settle_planned`)."""
    return settle_planned(conn, SettlePlan(settlements), now)


def settle_planned(
    conn: sqlite3.Connection, plan: SettlePlan, now: float, *, slots_after: bool = False
) -> list[JobId]:
    """``plan``'s settlements in order, in the caller's transaction; answers the job ids that
    applied. Completions of jobs the batch settles once are written together (_complete_all):
    a worker's batch is mostly these, and an UPDATE and an INSERT per job were most of a
    settle's cost (issue 35). ``slots_after``: as _complete_all's."""
    if plan.one_by_one:
        return [s.lease.job_id for s in plan.settlements if _settle_one(conn, s, now)]
    applied: set[JobId] = set()
    written_together: set[JobId] = set()
    if plan.together is not None:
        applied = _complete_all(
            conn, plan.together, plan.together_ids, now, slots_after=slots_after
        )
        written_together = set(plan.together_ids)
    for s in plan.settlements:
        job_id = s.lease.job_id
        if job_id not in written_together and _settle_one(conn, s, now):
            applied.add(job_id)
    return [job_id for job_id in plan.ids if job_id in applied]


class NotAllApplied(Exception):
    """A batch written with ``slots_after`` held a completion whose lease no longer held: which
    one, its UPDATE cannot say. Raised inside the transaction, which is rolled back; the caller
    writes the batch again without ``slots_after``."""


# The largest result written with others in one statement (_settle_all), where a batch's JSON
# is too long to pass whole: a batch of them is a few MiB of JSON at most, far inside SQLite's
# limit on one value (1 GB), which a batch of 1 MiB results, twice as long escaped, could pass.
_TOGETHER_AT_MOST = 64 * 1024
_BATCH_AT_MOST = 16 * 1024 * 1024


def _together_json(completes: Sequence[Complete]) -> str | None:
    """_complete_all's JSON for ``completes``, [id, token, result, attempt, worker_id, seconds,
    traceback] each (the note's fields null without one); None when fewer than two (one alone
    is one statement either way), or where a text would not come through SQLite's JSON as it
    is: no ``\\u`` escape at all means no text holds a NUL, a control character, anything
    past ASCII or a lone surrogate (stored as bytes that cannot be read back)."""
    if len(completes) < 2:
        return None
    rows: list[list[object]] = []
    for s in completes:
        note = s.note
        if note is None:
            rows.append([s.lease.job_id, s.lease.token, s.result, None, None, None, None])
        else:
            rows.append(
                [
                    s.lease.job_id,
                    s.lease.token,
                    s.result,
                    note.attempt,
                    note.worker_id,
                    note.seconds,
                    note.traceback,
                ]
            )
    try:
        text = json.dumps(rows, allow_nan=False)  # JSON has no NaN: such a note goes alone
    except ValueError:
        return None
    if "\\u" in text or len(text) > _BATCH_AT_MOST:
        return None
    return text


def _plain_result(result: str | None) -> bool:
    """Whether a completion's result goes through the JSON of _complete_all unchanged: what
    dump_json makes (ASCII, no NUL) and small. Anything else is written alone, as it always
    was (a lone surrogate refused there, not stored as bytes that cannot be read back)."""
    return result is None or (
        len(result) <= _TOGETHER_AT_MOST and result.isascii() and "\x00" not in result
    )


def _together(s: Complete) -> bool:
    """Whether a completion may be written with others where its batch's JSON as a whole may
    not (_together_json): its result and its note's texts pass _plain_result."""
    note = s.note
    return _plain_result(s.result) and (
        note is None
        or (
            _plain_result(note.traceback)
            and _plain_result(note.worker_id)
            and (note.seconds is None or math.isfinite(note.seconds))
        )
    )


# _complete_all's statements. Each is one step of SQLite's, whatever the batch's size: the
# GIL is let go and taken back at each step, and each take costs the worker's loop a lend
# (_gil_handoff.py; issue 44: a statement that returned a row per job took it back once a job).
# Each reads the batch from _together_json's JSON, fenced as _FENCE is.
_JOINED: Final = (
    " FROM json_each(?{n}) AS u JOIN jobs ON jobs.id = json_extract(u.value, '$[0]')"
    " AND jobs.token = json_extract(u.value, '$[1]') AND jobs.state = 'running'"
)
# The completions that do not apply, and those that do and hold a fleet slot (most batches:
# none): [id, applies, token] each.
_UNUSUAL: Final = (
    "SELECT json_group_array(json_array(json_extract(u.value, '$[0]'), jobs.id IS NOT NULL,"
    " json_extract(u.value, '$[1]')))"
    " FROM json_each(?1) AS u LEFT JOIN jobs ON jobs.id = json_extract(u.value, '$[0]')"
    " AND jobs.token = json_extract(u.value, '$[1]') AND jobs.state = 'running'"
    " WHERE jobs.id IS NULL OR jobs.slot_key IS NOT NULL"
)
# Their history rows, before their UPDATE (the sequence number their ending takes is the
# job's next): what _history_row makes for a completion, which stores no error and stands
# against a pending cancel (the conformance suite's batch of completions checks the row).
_INSERT_COMPLETED: Final = (
    "INSERT OR REPLACE INTO attempts (job_id, slot, seq, attempt, outcome, worker_id,"
    " ended_at, seconds, error, traceback)"
    " SELECT jobs.id, (jobs.attempt_seq + 1) % ?1, jobs.attempt_seq + 1,"
    " json_extract(u.value, '$[3]'), 'completed', json_extract(u.value, '$[4]'), ?2,"
    " json_extract(u.value, '$[5]'), NULL, json_extract(u.value, '$[6]')"
    + _JOINED.format(n=3)
    + " WHERE json_extract(u.value, '$[3]') IS NOT NULL"
)
_COMPLETE: Final = (
    "UPDATE jobs SET state = 'completed', result = json_extract(u.value, '$[2]'),"
    " lease_until = NULL, worker_id = NULL, cancel_requested = 0, token = NULL,"
    " updated_at = ?1, attempt_seq = attempt_seq + 1"
    " FROM json_each(?2) AS u"
    " WHERE jobs.id = json_extract(u.value, '$[0]')"
    " AND jobs.token = json_extract(u.value, '$[1]') AND jobs.state = 'running'"
)


def _complete_all(
    conn: sqlite3.Connection,
    together: str,
    ids: Sequence[JobId],
    now: float,
    *,
    slots_after: bool = False,
) -> set[JobId]:
    """What _write_settlement writes for each completion of ``together`` (_together_json's,
    each job once), fenced the same way: one UPDATE for all, one INSERT for their history.

    ``slots_after`` (a settle that a claim follows in its transaction): one statement fewer,
    so one turn fewer of the thread's at the GIL (_gil_handoff.py). The UPDATE's count says
    whether every completion applied (if not, NotAllApplied); the fleet slots they hold are the
    claim's to free, as its look finds them (_jobs._claim_in)."""
    unusual = "[]"
    if not slots_after:
        (unusual,) = conn.execute(_UNUSUAL, (together,)).fetchone()
    conn.execute(_INSERT_COMPLETED, (ATTEMPT_HISTORY, now, together))
    written = conn.execute(_COMPLETE, (now, together)).rowcount
    if slots_after and written != len(ids):
        raise NotAllApplied
    applied = set(ids)
    if unusual != "[]":
        for job_id, applies, token in json.loads(unusual):
            if not applies:
                applied.discard(job_id)
            else:
                release_slot(conn, token, now)
    return applied


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
        release_slot(conn, s.lease.token, now)
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


def release_slot(conn: sqlite3.Connection, token: str, now: float) -> None:
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
