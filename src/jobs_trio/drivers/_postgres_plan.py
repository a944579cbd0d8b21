# The PostgreSQL enqueue, event send and schema check as plans of statements, free of any client
# library: the driver runs them on asyncpg under Trio, the producers (jobs_trio.sync,
# jobs_trio.aio) on psycopg or asyncpg. Apart so that how a batch is written and how its unique
# keys are settled is said once, whichever client sends the statements.
from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator, Sequence
from typing import Any

import attrs

from .._core.errors import ConfigError, DriverError
from .._core.records import Enqueued, NewJob
from ._postgres_sql import Statements
from ._rows import limit_fields

# How often a unique-key enqueue looks again when the live job holding its key finished between
# the insert (which saw it) and the lookup (which did not). Each round makes progress unless
# keys are being freed and taken in a tight loop by others.
KEY_ROUNDS = 5

Rows = list[Sequence[Any]]  # a statement's rows, read by position


@attrs.frozen
class Query:
    """One statement of a plan: its text (``$n`` placeholders, as PostgreSQL writes them) and
    its arguments in order."""

    sql: str
    args: tuple[Any, ...]


# A plan yields each statement it needs run, is sent that statement's rows, and returns its
# answer. Run inside one transaction (the caller's or one of the runner's own).
Plan = Generator[Query, Rows, Any]


def job_columns(jobs: Sequence[NewJob]) -> list[list[Any]]:
    """The unnest arrays of a batch of new jobs (id, name, queue, payload, priority,
    max_attempts, delay, key, context), in that parameter order."""
    return [
        [j.job_id for j in jobs],
        [j.name for j in jobs],
        [j.queue for j in jobs],
        [j.payload for j in jobs],
        [j.priority for j in jobs],
        [j.max_attempts for j in jobs],
        [float(j.delay) for j in jobs],
        [j.key for j in jobs],
        [j.context for j in jobs],
    ]


def limit_columns(jobs: Sequence[NewJob]) -> list[list[Any]]:
    """The unnest arrays of the jobs' fleet limits (slot_key, slots, rate_key, starts, per),
    after enqueue's channel parameter; all NULL for a job without limits."""
    fields = [limit_fields(j.limits) for j in jobs]
    return [
        [f[name] for f in fields] for name in ("slot_key", "slots", "rate_key", "starts", "per")
    ]


def insert_query(sql: Statements, now: float, batch: Sequence[NewJob]) -> Query:
    """The insert of ``batch`` that notifies its queues in the same statement; its rows are the
    ids written (a job whose key a live job holds is not)."""
    columns, limits = job_columns(batch), limit_columns(batch)
    if len(batch) == 1:  # the common call: the same parameters as scalars, a cheaper statement
        return Query(
            sql["enqueue_one"],
            (now, *(c[0] for c in columns), sql.channel, *(c[0] for c in limits)),
        )
    return Query(sql["enqueue"], (now, *columns, sql.channel, *limits))


def enqueue_plan(sql: Statements, now: float, jobs: Sequence[NewJob]) -> Plan:
    """Write ``jobs``; answer each one's ``Enqueued`` in order (a keyed job whose key a live
    job holds, or a job within its window, answers that job's id, not created).

    Without keys this is one statement, atomic on its own. With keys, the holders are looked
    up after the insert (each statement of a READ COMMITTED transaction gets a fresh snapshot
    that can see a holder committed meanwhile) and the insert may be tried again: run in one
    transaction, so a failure part-way commits none of it."""
    answers: dict[int, Enqueued] = {}
    windowed = [i for i, job in enumerate(jobs) if job.unique_for is not None]
    if windowed:
        answers = yield from _window_holders(sql, now, jobs, windowed)
    pending = [i for i in range(len(jobs)) if i not in answers]
    if not pending:  # every job's key held by its window: nothing to write
        return [answers[i] for i in range(len(jobs))]
    for _ in range(KEY_ROUNDS):
        rows = yield insert_query(sql, now, [jobs[i] for i in pending])
        created = {row[0] for row in rows}
        for i in pending:
            if jobs[i].job_id in created:
                answers[i] = Enqueued(jobs[i].job_id, created=True)
        # Only a keyed row can have been skipped: the conflict target is the key index.
        skipped_keys = [jobs[i].key for i in pending if i not in answers]
        if skipped_keys:
            rows = yield Query(sql["live_key_holders"], (skipped_keys,))
            holders = {row[0]: row[1] for row in rows}
            for i in pending:
                key = jobs[i].key
                if i not in answers and key in holders:
                    answers[i] = Enqueued(holders[key], created=False)
        pending = [i for i in pending if i not in answers]
        if not pending:
            return [answers[i] for i in range(len(jobs))]
    raise DriverError(
        f"could not settle unique keys {[jobs[i].key for i in pending]}: their "
        "holders kept finishing and being replaced while this enqueue ran",
        fix="retry the enqueue",
    )


def _window_holders(
    sql: Statements, now: float, jobs: Sequence[NewJob], windowed: Sequence[int]
) -> Generator[Query, Rows, dict[int, Enqueued]]:
    """The answers of the jobs (``windowed``: their indexes) whose key a job within the window
    holds, after taking their keys' locks (lock_keys says why). A job of the batch that holds
    another's key is not seen here: it is not written yet, and the live-key index decides."""
    keys = sorted({key for i in windowed if (key := jobs[i].key) is not None})
    yield Query(sql["lock_keys"], (keys, f"jobs_trio:{sql.schema}:key:"))
    rows = yield Query(
        sql["window_holders"],
        (
            now,
            [jobs[i].key for i in windowed],
            [jobs[i].unique_for for i in windowed],
            [",".join(jobs[i].unique_states) for i in windowed],
        ),
    )
    isolation = rows[0][2]
    if isolation != "read committed":
        # Its snapshot was taken before the key's lock was: a job of the key committed by the
        # enqueue that held the lock is not seen, and a second job is written in the window.
        raise ConfigError(
            f"a key with a window ({keys[0]!r}) cannot be enqueued in a {isolation.upper()}"
            " transaction: its look for the key's holder must see jobs committed after the"
            " transaction began, or two enqueues could both find the key free",
            fix="enqueue it in a READ COMMITTED transaction (PostgreSQL's default), or outside"
            " this one (without connection=); a key without a window is fine at any level",
        )
    return {
        windowed[ordinal - 1]: Enqueued(holder, created=False)
        for ordinal, holder, _ in rows
        if holder is not None
    }


def event_plan(sql: Statements, now: float, name: str, payload: str, key: str | None) -> Plan:
    """Store an event; answer its id. One statement. Its waiters are woken (their queues
    notified) when its transaction commits, by the trigger migration 0014 made: a send in a
    caller's transaction that commits later finds the jobs that suspended meanwhile too."""
    rows = yield Query(sql["send_event"], (now, name, key, payload))
    return str(rows[0][0])


def run_plan(plan: Plan, fetch: Callable[[Query], Rows]) -> Any:
    """Run ``plan`` with a blocking ``fetch`` (psycopg)."""
    try:
        query = next(plan)
        while True:
            query = plan.send(fetch(query))
    except StopIteration as done:
        return done.value


async def run_plan_async(plan: Plan, fetch: Callable[[Query], Awaitable[Rows]]) -> Any:
    """Run ``plan`` with an awaitable ``fetch`` (asyncpg, psycopg's async connection)."""
    try:
        query = next(plan)
        while True:
            query = plan.send(await fetch(query))
    except StopIteration as done:
        return done.value


async def fetch_on(conn: Any, query: Query) -> Rows:
    """A plan's statement run on an asyncpg connection (asyncpg takes ``$n`` as it is)."""
    return list(await conn.fetch(query.sql, *query.args))
