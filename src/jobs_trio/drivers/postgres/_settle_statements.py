# The PostgreSQL driver's settle and renew encodings: a batch of endings as columns for one
# statement, and what it answered. Apart from _jobs.py because a batch's encoding is its own craft.
from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, cast

from ..._core.operator_transitions import cancel_instead
from ..._core.records import ClaimToken, Complete, JobId, Lease, RenewResult, Settlement
from .._postgres_errors import ROW_LOCK_STATES
from .._postgres_pool import Connection
from .._postgres_sql import Statements
from .._rules import effect, history_outcome, kind_of


def _by_kind(settlements: Sequence[Settlement]) -> dict[str, list[Settlement]]:
    """Each kind's settlements, one per claim: a second for the same lease in the batch would
    find the token already cleared by the first, which is what applying them in order means.
    The (id, token) keys are dropped here, before the statement's round trip: kept through it,
    they were an object per settlement in flight for the garbage collector (issue 44)."""
    if not settlements:
        return {}
    # The usual batch: one kind, one settlement a claim (tokens are made per claim, so
    # distinct tokens are distinct claims), taken whole without a key made per settlement.
    first = type(settlements[0])
    if all(type(s) is first for s in settlements) and len(
        {s.lease.token for s in settlements}
    ) == len(settlements):
        return {kind_of(settlements[0]).name: list(settlements)}
    firsts: dict[tuple[JobId, str], Settlement] = {}
    for s in settlements:
        firsts.setdefault((s.lease.job_id, s.lease.token), s)
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
    by_kind: Mapping[str, Sequence[Settlement]],
) -> Callable[[Connection], Awaitable[tuple[set[tuple[JobId, str]], set[JobId]]]]:
    """Driver.settle's statements, as an operation on a connection."""

    async def apply(conn: Connection) -> tuple[set[tuple[JobId, str]], set[JobId]]:
        return await _apply_settles(conn, sql, now, by_kind)

    return apply


async def _apply_settles(
    conn: Connection,
    sql: Statements,
    now: float,
    by_kind: Mapping[str, Sequence[Settlement]],
) -> tuple[set[tuple[JobId, str]], set[JobId]]:
    """Each kind's statement; answers what applied, and the job ids of the rows skipped for a
    lock another session holds (only a single kind's statement skips any: several kinds lock
    every row first, waiting at most the lock timeout)."""
    if len(by_kind) > 1:
        ids = {s.lease.job_id for group in by_kind.values() for s in group}
        await conn.execute(sql["lock_for_settle"], sorted(ids))
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
    if len(applied) == len(settlements):
        # As many applied as were sent (the answer names only the batch's rows): every one
        # applied, and no two were one claim's.
        return list(dict.fromkeys([s.lease.job_id for s in settlements]))
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
    if isinstance(group[0], Complete):
        return _complete_columns(cast("Sequence[Complete]", group))
    effects = [effect(s) for s in group]
    columns: list[Any] = [
        _text_array([s.lease.job_id for s in group]),
        _text_array([s.lease.token for s in group]),
        _bool_array([e.hands_back for e in effects]),
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
        _number_array([None if n is None else n.attempt for n in notes]),
        _text_array([history_outcome(s) for s in group]),
        _text_array([None if n is None else n.worker_id for n in notes]),
        _seconds_array([None if n is None else n.seconds for n in notes]),
        _text_array([None if n is None else n.traceback for n in notes]),
    ]
    return columns


def _complete_columns(group: Sequence[Complete]) -> list[Any]:
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
        _text_array(ids),
        _text_array(tokens),
        _bool_array([False] * n),  # none hands its attempt back
        _text_array(results),
        _number_array(attempts),
        _text_array(["completed"] * n),
        _text_array(workers),
        _seconds_array(seconds),
        _text_array(tracebacks),
    ]


# An array of text as one parameter, the literal PostgreSQL reads ('{"a","b",NULL}'), which the
# statement casts ($3::text::text[]): asyncpg's array encoder looks at every element for an
# iterable inside it (two ABC checks a string, a Python call each), ~14 a completed job across
# its columns, a few per cent of a no-op job (issue 44). Every element is quoted, so a comma,
# brace, space or the word NULL in one is only text; with no quote or backslash anywhere (ids,
# tokens, worker ids, outcome names, JSON's null, numbers) the whole is one join. Otherwise
# each element is escaped; None is NULL.
def _text_array(values: Sequence[str | None]) -> str:
    if None not in values:
        texts = cast("Sequence[str]", values)
        whole = "".join(texts)
        if '"' not in whole and "\\" not in whole:
            return '{"' + '","'.join(texts) + '"}' if texts else "{}"
    return "{" + ",".join("NULL" if v is None else _quoted(v) for v in values) + "}"


def _quoted(text: str) -> str:
    """An element of an array literal, quoted: its backslashes and double quotes escaped."""
    if type(text) is not str:
        raise TypeError(f"a text column's value is a {type(text).__name__}, not str: {text!r}")
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _number_array(values: Sequence[float | None]) -> str:
    """``_text_array`` for numbers: each as its repr (an int's digits; a float's shortest text
    that reads back as the same float, which PostgreSQL's float8 reads exactly), None as NULL."""
    if None not in values:
        return "{" + ",".join(map(repr, values)) + "}"
    return "{" + ",".join(["NULL" if value is None else repr(value) for value in values]) + "}"


def _seconds_array(values: Sequence[float | None]) -> str:
    """An attempt's durations for a float8[] column: each as whole nanoseconds in e-notation
    (``7123e-9``, which float8 reads as the double nearest 7.123 µs), None as NULL. A float's
    repr (its shortest exact text) was 2% of a no-op job's worker CPU (issue 44); a duration
    kept to the nanosecond keeps all a clock measured. Not a finite number (a clock gone
    wrong): each as its repr, as ``_number_array`` writes it."""
    try:
        if not values:
            return "{}"
        if None not in values:
            whole = cast("Sequence[float]", values)
            return "{" + "e-9,".join([str(round(v * 1e9)) for v in whole]) + "e-9}"
        return (
            "{" + ",".join(["NULL" if v is None else f"{round(v * 1e9)}e-9" for v in values]) + "}"
        )
    except (OverflowError, ValueError):  # round() of inf or nan
        return _number_array(values)


def _bool_array(values: Sequence[bool]) -> str:
    return "{" + ",".join(["t" if value else "f" for value in values]) + "}"
