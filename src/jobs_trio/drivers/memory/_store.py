# The memory driver's store: its dicts, its clock and its wake-ups, which every capability reads.
# Apart because it is the memory driver's one "connection": the rooms beside it hold no state.
from __future__ import annotations

import collections
import itertools
import math
import time
from collections.abc import Callable, Sequence

import attrs
import trio

from ..._core.records import (
    AttemptRecord,
    Enqueued,
    EventRecord,
    JobId,
    JobRecord,
    JobState,
    Lease,
    NewJob,
    QueuePause,
    QueueStats,
    RelayDecision,
    StepRecord,
    TaskMark,
    WorkerPresence,
    new_token,
)
from .._limit_rules import LimitRow
from .._rows import limit_fields
from .._rules import LIVE_STATES, Unseen, driver_closed, in_window, refuse_connection


@attrs.frozen
class _OutboxRow:
    job: NewJob
    run_at: float
    created_at: float
    claimed_until: float | None = None
    relay_id: str | None = None
    ticket: str | None = None  # the ticket of the relay holding it (relay_ticket)
    superseded: tuple[str, ...] = ()  # the tickets of every relay that held it before


class MemoryStore:
    """The state every capability of the memory driver reads and writes."""

    def __init__(self, *, clock: Callable[[], float] = time.time, url: str = "memory://") -> None:
        self.url = url
        self._clock = clock
        self._jobs: dict[JobId, JobRecord] = {}
        # The current token of each running job: kept beside the record because a record is
        # what operators read, and a token must never leak into `show` output.
        self._tokens: dict[JobId, str] = {}
        # Claims marked ahead whose start no renewal has recorded, and how many lapses of each
        # job gave its attempt back (rules.hands_back_lapse): kept beside the record, as the
        # SQL drivers keep them in columns no record shows.
        self._ahead: set[JobId] = set()
        self._ahead_lapses: collections.Counter[JobId] = collections.Counter()
        # Suspects claimed alone, running (Claim.alone): a lapse of one is its own doing.
        self._alone: set[JobId] = set()
        self._steps: dict[JobId, dict[str, StepRecord]] = {}
        # Each job's newest attempt records, and how many it has had (AttemptRecord.seq).
        self._attempts: dict[JobId, collections.deque[AttemptRecord]] = {}
        self._attempt_seq: collections.Counter[JobId] = collections.Counter()
        self._workers: dict[str, WorkerPresence] = {}
        self._events: list[EventRecord] = []
        self._event_ids = itertools.count(1)
        self._lot = trio.lowlevel.ParkingLot()
        # Paused queues (pause_queue), and who waits to hear of a change (wait_for_pauses).
        self._pauses: dict[str, QueuePause] = {}
        self._pause_lot = trio.lowlevel.ParkingLot()
        # Every pause and resume counts one (PauseLook.epoch); each worker's last confirmed
        # epoch and when it confirmed it (pauses_heard).
        self._pause_epoch = 0
        self._pauses_heard: dict[str, tuple[int, float]] = {}
        self._closed = False
        self._task_marks: dict[str, TaskMark] = {}
        self._task_fires: dict[str, dict[float, JobId]] = {}
        # The outbox, oldest first (insertion order): job, when it is due, when it was written,
        # and until when a relay holds it.
        self._outbox: dict[JobId, _OutboxRow] = {}
        # Who this outbox is (outbox_source), and the relay's decisions with the outbox each
        # came from (relay_enqueue): what a row taken again is answered with.
        self._outbox_source = new_token()
        self._decisions: dict[JobId, tuple[str, RelayDecision]] = {}
        # The relays' live tickets: ticket -> (outbox source, when it is forgotten).
        self._tickets: dict[str, tuple[str, float]] = {}
        # fleet_stats: when the last turn was taken, and what it observed.
        self._fleet_turn_at = -math.inf
        self._fleet_observed: tuple[QueueStats, ...] = ()
        # The prune turn: who holds it, until when, and when the last turn ended.
        self._prune_turn: tuple[str | None, float | None, float | None] = (None, None, None)
        # Fleet limits (_limit_rules.py): a job's own, and what a put-off job waits for, are in
        # its record (as the SQL drivers' rows hold them); the limit rows by (kind, key) then n.
        self._limit_rows: dict[tuple[str, str], dict[int, LimitRow]] = {}

    def now(self) -> float:
        return self._clock()

    def _check_open(self) -> None:
        if self._closed:
            raise driver_closed("memory")

    async def _write_alone(self, connection: object | None, *, fix: str) -> None:
        """The start of a write that cannot join a caller's transaction: a checkpoint (as
        every driver call has), the driver open, and ``connection=`` refused (``fix``: what to
        do instead)."""
        await trio.lowlevel.checkpoint()
        self._check_open()
        refuse_connection(connection, driver="memory", fix=fix)

    def _wake(self) -> None:
        self._lot.unpark_all()

    def _put(self, record: JobRecord, **changes: object) -> JobRecord:
        updated = attrs.evolve(record, updated_at=self.now(), **changes)  # type: ignore[arg-type]
        self._jobs[record.id] = updated
        return updated

    def _insert(self, jobs: Sequence[NewJob], now: float) -> list[Enqueued]:
        live_keys = {
            r.key: r.id for r in self._jobs.values() if r.key is not None and r.state in LIVE_STATES
        }
        answers = []
        for job in jobs:
            if job.unique_for is not None:
                holders = [r for r in self._jobs.values() if in_window(r, job, now)]
                if holders:
                    newest = max(holders, key=lambda r: (r.created_at, r.id))
                    answers.append(Enqueued(newest.id, created=False))
                    continue
            if job.key is not None and job.key in live_keys:
                answers.append(Enqueued(live_keys[job.key], created=False))
                continue
            self._jobs[job.job_id] = JobRecord(
                id=job.job_id,
                name=job.name,
                queue=job.queue,
                state=JobState.READY,
                payload=job.payload,
                priority=job.priority,
                attempts=0,
                max_attempts=job.max_attempts,
                run_at=now + max(job.delay, 0.0),
                created_at=now,
                updated_at=now,
                key=job.key,
                context=job.context,
                **limit_fields(job.limits),
            )
            if job.key is not None:
                live_keys[job.key] = job.job_id
            answers.append(Enqueued(job.job_id, created=True))
        return answers

    def _current(self, lease: Lease) -> JobRecord | None:
        record = self._jobs.get(lease.job_id)
        if record is None or record.state is not JobState.RUNNING:
            return None
        if self._tokens.get(lease.job_id) != lease.token:
            return None
        return record

    def _stored_past(self, unseen: Unseen) -> bool:
        return any(unseen.covers(e.name, e.key, int(e.id)) for e in self._events)

    async def aclose(self) -> None:
        self._closed = True
        self._wake()
        self._pause_lot.unpark_all()
