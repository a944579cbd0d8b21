# What one producer call writes, checked and built by the Trio API's own code (JobDefinition's
# rows, the event check): a batch of jobs or an event, rendered for SQLite (a function of a
# sqlite3 connection) or for PostgreSQL (a plan of statements). Apart so that the sync and the
# asyncio producer differ only in how they reach a connection.
from __future__ import annotations

import sqlite3
from collections.abc import Sequence

import attrs

from .._core.records import Enqueued, NewJob
from .._jobs.registry import ENQUEUE_CHUNK
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
        # In statements of at most ENQUEUE_CHUNK rows, as enqueue_many's chunks: no statement
        # grows with the batch (one of a million rows ran past the statement timeout).
        answers: list[Enqueued] = []
        for start in range(0, len(self.jobs), ENQUEUE_CHUNK):
            chunk = self.jobs[start : start + ENQUEUE_CHUNK]
            answers += yield from enqueue_plan(sql, now, chunk)
        return answers


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
