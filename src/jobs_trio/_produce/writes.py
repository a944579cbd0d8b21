# What one producer call writes, checked and built by the Trio API's own code (JobDefinition's
# rows, the event check): a batch of jobs or an event, rendered for SQLite (a function of a
# sqlite3 connection) or for PostgreSQL (a plan of statements). Apart so that the sync and the
# asyncio producer differ only in how they reach a connection.
from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence
from typing import Any

import attrs

from .._core.chunks import enqueue_chunks
from .._core.records import Enqueued, JobId, NewJob
from .._jobs.registry import EnqueueManyOptions, EnqueueOptions, JobDefinition
from ..drivers._postgres_plan import Plan, enqueue_plan, event_plan
from ..drivers._postgres_sql import Statements
from ..drivers._sqlite_enqueue import insert_jobs, store_event


@attrs.frozen
class EnqueueWrite:
    """Jobs to write, in one transaction; the answer is each one's ``Enqueued``."""

    jobs: Sequence[NewJob]

    def on_sqlite(self, conn: sqlite3.Connection, now: float) -> list[Enqueued]:
        return insert_jobs(conn, self.jobs, now)

    def plan(self, sql: Statements, now: float) -> Plan:
        # In enqueue_many's chunks: no statement grows with the batch (one of a million rows ran
        # past the statement timeout; one of 1 GB past PostgreSQL's message limit).
        answers: list[Enqueued] = []
        for chunk in enqueue_chunks(self.jobs):
            answers += yield from enqueue_plan(sql, now, chunk)
        return answers


def one_job(job: JobDefinition[Any, Any], payload: Any, options: EnqueueOptions) -> EnqueueWrite:
    """A producer's ``enqueue``: the row checked by the definition, as its own ``enqueue``
    checks it (a bad payload, delay, key, window or context raises before any write)."""
    row = job.new_job(
        payload,
        delay=options.get("delay"),
        run_at=options.get("run_at"),
        priority=options.get("priority"),
        key=options.get("key"),
        context=options.get("context"),
        unique_for=options.get("unique_for"),
        unique_states=options.get("unique_states"),
    )
    return EnqueueWrite([row])


def one_job_answer(
    job: JobDefinition[Any, Any], answer: Enqueued, options: EnqueueOptions
) -> JobId:
    """What a producer's ``enqueue`` answers, as ``JobDefinition.enqueue`` does: the id
    written, or the id of the live job holding the key (``DuplicateJob`` when asked)."""
    return job.answered(answer, options.get("key"), options.get("on_duplicate", "existing"))


def many_jobs(
    job: JobDefinition[Any, Any], payloads: Iterable[Any], options: EnqueueManyOptions
) -> EnqueueWrite:
    """A producer's ``enqueue_many``: every payload checked before anything is written."""
    rows = job.new_jobs(
        payloads,
        delay=options.get("delay"),
        run_at=options.get("run_at"),
        priority=options.get("priority"),
        context=options.get("context"),
    )
    return EnqueueWrite(rows)


@attrs.frozen
class EventWrite:
    """An event to store (its payload as checked text); the answer is its id."""

    name: str
    payload: str
    key: str | None

    def on_sqlite(self, conn: sqlite3.Connection, now: float) -> str:
        return store_event(conn, self.name, self.payload, self.key, now)

    def plan(self, sql: Statements, now: float) -> Plan:
        event_id: str = yield from event_plan(sql, now, self.name, self.payload, self.key)
        return event_id


Write = EnqueueWrite | EventWrite
