# The memory driver's admin side: reads (get, list, stats, history) and operator transitions.
# Apart because nothing on a worker's path calls it, only the CLI, dashboard and pruner.
from __future__ import annotations

import collections
import math
from collections.abc import Sequence

import trio

from ..._core.operator_transitions import (
    OPERATOR_CANCEL_ERROR,
    cancel_flags_only,
    check_delete,
    check_retry,
    check_run_now,
    found,
    key_held,
)
from ..._core.records import (
    WAITING_STATES,
    AttemptRecord,
    JobId,
    JobRecord,
    JobState,
    NameStats,
    OutcomeCount,
    Pruned,
    PruneTurn,
    QueueStats,
)
from .._calls import JobFilter, ListCalls
from .._retention import DEAD_STATE, FINISHED_STATES, cutoffs, turn_is_free
from .._rules import (
    LIVE_STATES,
    name_stats,
    queue_stats,
)
from ._store import MemoryStore


class MemoryAdmin(ListCalls, MemoryStore):
    """What operators read and do: jobs, stats, history, retention."""

    async def get(self, job_id: JobId) -> JobRecord | None:
        await trio.lowlevel.checkpoint()
        self._check_open()
        return self._jobs.get(job_id)

    async def _list_jobs(self, wanted: JobFilter) -> Sequence[JobRecord]:
        state, queue, name, changed_before, limit = wanted.parts()
        await trio.lowlevel.checkpoint()
        self._check_open()
        found = [
            r
            for r in self._jobs.values()
            if (state is None or r.state is state)
            and (queue is None or r.queue == queue)
            and (name is None or r.name == name)
            and (changed_before is None or r.updated_at < changed_before)
        ]
        found.sort(key=lambda r: (r.created_at, r.id), reverse=True)
        return found[: max(limit, 0)]  # a negative limit lists nothing, as on SQLite and PostgreSQL

    async def retry(self, job_id: JobId) -> JobRecord:
        await trio.lowlevel.checkpoint()
        self._check_open()
        record = found(self._jobs.get(job_id), job_id)
        check_retry(record)
        if record.key is not None and any(
            r.key == record.key and r.state in LIVE_STATES and r.id != job_id
            for r in self._jobs.values()
        ):
            raise key_held(job_id, record.key)
        updated = self._put(
            record,
            state=JobState.READY,
            run_at=self.now(),
            attempts=0,
            orphans=0,  # an operator's re-run starts its count afresh, as its attempts
            cancel_requested=False,
            waiting_on=None,
        )
        self._ahead_lapses.pop(job_id, None)  # a fresh start: its attempts, and their bound
        self._wake()
        return updated

    async def cancel(self, job_id: JobId) -> JobRecord:
        await trio.lowlevel.checkpoint()
        self._check_open()
        record = found(self._jobs.get(job_id), job_id)
        if cancel_flags_only(record):
            return self._put(record, cancel_requested=True)
        return self._put(record, state=JobState.CANCELLED, last_error=OPERATOR_CANCEL_ERROR)

    async def delete(self, job_id: JobId) -> JobRecord:
        await trio.lowlevel.checkpoint()
        self._check_open()
        record = found(self._jobs.get(job_id), job_id)
        check_delete(record)
        del self._jobs[job_id]
        for kept in (self._steps, self._attempts, self._attempt_seq, self._ahead_lapses):
            kept.pop(job_id, None)
        self._ahead.discard(job_id)
        return record

    async def run_now(self, job_id: JobId) -> JobRecord:
        await trio.lowlevel.checkpoint()
        self._check_open()
        record = found(self._jobs.get(job_id), job_id)
        check_run_now(record)
        now = self.now()
        if record.run_at <= now:
            return record
        updated = self._put(record, run_at=now)
        self._wake()
        return updated

    async def stats(self) -> Sequence[QueueStats]:
        await trio.lowlevel.checkpoint()
        self._check_open()
        now = self.now()
        depths = collections.Counter((r.queue, r.state.value) for r in self._jobs.values())
        due: dict[str, list[float]] = {}
        for r in self._jobs.values():
            if r.state is JobState.READY and r.run_at <= now:
                due.setdefault(r.queue, []).append(r.run_at)
        waiting = collections.Counter(
            (r.queue, r.name, r.waiting_on.split(":", 1)[0])
            for r in self._jobs.values()
            if r.state in WAITING_STATES and r.waiting_on is not None
        )
        return queue_stats(
            ((queue, state, n) for (queue, state), n in depths.items()),
            ((queue, len(run_ats), min(run_ats)) for queue, run_ats in due.items()),
            now,
            ((*key, n) for key, n in waiting.items()),
            self._pauses,
        )

    async def fleet_stats(self, worker_id: str, interval: float) -> Sequence[QueueStats]:
        await trio.lowlevel.checkpoint()
        self._check_open()
        now = self.now()
        if self._fleet_turn_at <= now - interval:
            self._fleet_turn_at = now
            self._fleet_observed = tuple(await self.stats())
        return self._fleet_observed

    async def prune(self, turn: PruneTurn) -> Pruned:
        await trio.lowlevel.checkpoint()
        self._check_open()
        now = self.now()
        if not turn_is_free(turn, *self._prune_turn, now):
            return Pruned(turn=False)
        finished_before, dead_before = cutoffs(turn, now)
        doomed = [
            r.id
            for r in self._jobs.values()
            if (r.state in FINISHED_STATES and r.updated_at < finished_before)
            or (dead_before is not None and r.state is DEAD_STATE and r.updated_at < dead_before)
        ][: turn.limit]
        for job_id in doomed:
            del self._jobs[job_id]
            self._steps.pop(job_id, None)
            self._attempts.pop(job_id, None)
            self._attempt_seq.pop(job_id, None)
        more = len(doomed) == turn.limit
        if more:
            self._prune_turn = (turn.holder, now + turn.hold, self._prune_turn[2])
        else:
            self._prune_turn = (None, None, now)
        return Pruned(turn=True, deleted=len(doomed), more=more)

    # Attempt history and worker presence (what the dashboard shows).

    async def load_attempts(self, job_id: JobId) -> Sequence[AttemptRecord]:
        await trio.lowlevel.checkpoint()
        self._check_open()
        return list(self._attempts.get(job_id, ()))

    async def outcome_counts(self, since: float, bucket: float) -> Sequence[OutcomeCount]:
        await trio.lowlevel.checkpoint()
        self._check_open()
        counts: collections.Counter[tuple[float, str]] = collections.Counter()
        for history in self._attempts.values():
            for one in history:
                if one.ended_at >= since:
                    counts[(math.floor(one.ended_at / bucket) * bucket, one.outcome)] += 1
        return [OutcomeCount(start, outcome, n) for (start, outcome), n in sorted(counts.items())]

    async def name_stats(self, since: float) -> Sequence[NameStats]:
        await trio.lowlevel.checkpoint()
        self._check_open()
        rows = [
            (
                self._jobs[job_id].name,
                one.outcome,
                1,
                int(one.seconds is not None),
                one.seconds,
                one.seconds,
            )
            for job_id, history in self._attempts.items()
            for one in history
            if one.ended_at >= since
        ]
        return name_stats(rows)
