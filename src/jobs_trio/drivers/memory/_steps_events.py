# The memory driver's durable steps and events: step records (fenced saves), sends and looks.
# Apart because a job's steps and the events it waits for outlive its attempts.
from __future__ import annotations

import json
from collections.abc import Sequence

import trio

from ..._core.records import (
    EventLook,
    EventRecord,
    JobId,
    JobState,
    Lease,
    StepRecord,
)
from .._rules import (
    event_mark,
    key_matches,
    send_wakes,
)
from ._store import MemoryStore


class MemoryStepsAndEvents(MemoryStore):
    """Durable steps and the events a suspended job waits for."""

    async def load_steps(self, job_id: JobId) -> Sequence[StepRecord]:
        await trio.lowlevel.checkpoint()
        self._check_open()
        return list(self._steps.get(job_id, {}).values())

    async def save_step(
        self, lease: Lease, step: StepRecord, *, connection: object | None = None
    ) -> bool:
        await self._write_alone(
            connection,
            fix="record steps with step.run here, or use the SQLite or PostgreSQL driver",
        )
        if self._current(lease) is None:
            return False
        self._steps.setdefault(lease.job_id, {})[step.name] = step
        return True

    async def send_event(
        self, name: str, payload: str, *, key: str | None = None, connection: object | None = None
    ) -> str:
        await trio.lowlevel.checkpoint()
        self._check_open()
        json.loads(payload)  # the boundary checked it; a driver never stores what it cannot read
        now = self.now()
        event = EventRecord(
            id=str(next(self._event_ids)), name=name, key=key, payload=payload, created_at=now
        )
        self._events.append(event)
        for record in list(self._jobs.values()):
            if send_wakes(record, name, key):
                self._put(record, state=JobState.READY, run_at=now)
        self._wake()
        return event.id

    async def look_for_event(self, name: str, *, key: str | None, since: float | None) -> EventLook:
        await trio.lowlevel.checkpoint()
        self._check_open()
        named = [event for event in self._events if event.name == name]
        seen = event_mark(int(named[-1].id) if named else None)
        for event in named:
            if not key_matches(key, event.key):
                continue
            if since is not None and event.created_at < since:
                continue
            return EventLook(event, seen)
        return EventLook(None, seen)
