# The PostgreSQL driver's durable steps and events: step records (fenced saves), sends and looks.
# Apart because a job's steps and the events it waits for outlive its attempts.
from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from typing import Any

from ..._core.records import EventLook, JobId, Lease, StepRecord
from .._postgres_plan import event_plan, fetch_on, run_plan_async
from .._postgres_pool import Connection
from .._rows import event_record, step_record, step_values
from ._connection import PostgresConnection


class PostgresStepsAndEvents(PostgresConnection):
    """Durable steps and the events a suspended job waits for."""

    # --- steps and events ---

    async def load_steps(self, job_id: JobId) -> Sequence[StepRecord]:
        rows = await self._fetch("load_steps", job_id, what="load_steps")
        return [step_record(row) for row in rows]

    async def save_step(
        self, lease: Lease, step: StepRecord, *, connection: object | None = None
    ) -> bool:
        self._check_open()
        sql = self._sql

        async def write(conn: Connection) -> Any:
            return await conn.fetchval(
                sql["save_step"], lease.job_id, lease.token, *step_values(step)
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
        row = await self._fetchrow("look_for_event", name, key, since, what="look_for_event")
        seen: str = row["seen"]  # the look's snapshot (rules.woken)
        return EventLook(None if row["id"] is None else event_record(row), seen)
