# The values a driver reads and writes: jobs to enqueue, claims, leases, settlements, records.
# Apart from the driver Protocol so the worker, the CLI and every driver share one vocabulary.
from __future__ import annotations

import enum
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any, Final

import attrs

from .fast_init import fast_init

JobId = str
ClaimToken = str


class JobState(enum.StrEnum):
    READY = "ready"  # a future run-at included
    RUNNING = "running"
    COMPLETED = "completed"
    DEAD = "dead"
    SUSPENDED = "suspended"
    PARKED = "parked"
    CANCELLED = "cancelled"

    def __str__(self) -> str:
        return self.value


# A job that waits to be claimed: due (its run-at passed) or not yet, for a time or an event.
# A claim takes jobs in these states, a freed fleet slot wakes one waiting in them.
WAITING_STATES: Final = (JobState.READY, JobState.SUSPENDED)


class OutcomeKind(enum.StrEnum):
    """What an attempt ended as, as the outcomes table (docs/model.md), ``WorkerStats``, the
    metrics (``jobs_trio_attempts_total``), the job's attempt history and the
    ``jobs.attempt.<kind>`` log lines spell it."""

    COMPLETED = "completed"
    SUSPENDED = "suspended"
    RETRIED = "retried"
    DEAD_LETTERED = "dead-lettered"
    INTERRUPTED = "interrupted"
    LOST = "lost"
    # The teardown's budget ran out on it: nothing written, its lease lapses.
    ABANDONED = "abandoned"
    CANCELLED = "cancelled"  # by an operator
    PARKED = "parked"  # its name is not in this deploy's registry
    # Its worker died under it (the lease lapsed): recorded in the job's history by the claim
    # that hands it back, never a worker's own outcome (docs/model.md, "A worker's death").
    ORPHANED = "orphaned"


# The orphan rule's numbers (drivers/_rules.py, orphaning; docs/model.md, "A worker's death"):
# a job orphaned SUSPECT_AT times runs only alone; one orphaned ORPHAN_LIMIT times is dead.
SUSPECT_AT: Final = 2
ORPHAN_LIMIT: Final = 5


def new_job_id() -> JobId:
    """A sortable id: milliseconds since the epoch, then a random 64-bit number (27 hex
    digits: 11, then 16)."""
    [job_id] = new_job_ids(1)
    return job_id


def new_job_ids(n: int) -> list[JobId]:
    """``n`` ids of ``new_job_id``'s shape, from one clock read and one read of the OS's
    randomness (a read each was a fifth of a batch enqueue's Python, issue 35), in the order
    given: one random start, counted up. A batch's jobs share their run-at, so their ids order
    them in the claim: in random order, a claim of 200 of them changed rows on ~200 table
    pages where the batch wrote them on a handful, and each commit wrote all those pages again
    (issue 44). The start is below 2**63, so the count never wraps; two batches of the same
    millisecond collide only if their ranges meet, (n1 + n2) / 2**63, where n1 * n2 / 2**64 was
    the chance of any two random numbers meeting."""
    stamp = f"{int(time.time() * 1000):011x}"
    start = int.from_bytes(os.urandom(8), "big") >> 1
    return [f"{stamp}{start + i:016x}" for i in range(n)]


def new_token() -> ClaimToken:
    return os.urandom(12).hex()


@attrs.frozen
class JobLimits:
    """A job's fleet-wide limits as its row stores them, resolved at enqueue from the job's
    declaration and payload (fleet_limits.py): the claim is SQL and cannot run Python."""

    slot_key: str | None = None  # at most `slots` runs of this key at once, fleet-wide
    slots: int = 0
    rate_key: str | None = None  # at most `starts` starts of this key in any `per` seconds
    starts: int = 0
    per: float = 0.0


@attrs.frozen
class NewJob:
    """One job to write. ``payload`` is JSON text, already checked at the enqueue boundary."""

    job_id: JobId
    name: str
    queue: str
    payload: str
    max_attempts: int
    priority: int = 0  # lower runs sooner
    delay: float = 0.0  # seconds after the driver's now
    key: str | None = None
    limits: JobLimits | None = None
    # JSON text of the run's context and trace context (run_context.py), checked; None: none.
    context: str | None = None
    # The key's window (rules.in_window): a job of this key created less than this many seconds
    # ago, live or in one of ``unique_states`` (finished states), makes this enqueue a no-op.
    # None: only a live job holds the key.
    unique_for: float | None = None
    unique_states: tuple[str, ...] = ()


# An outbox row's columns, in the order every driver reads them back (outbox_job's ``row``).
OUTBOX_COLUMNS = (
    "id, name, queue, payload, priority, max_attempts, key, run_at, context,"
    " slot_key, slots, rate_key, starts, per"
)


def outbox_job(row: Sequence[Any], now: float) -> NewJob:
    """An outbox row (OUTBOX_COLUMNS, in that order) as the job to relay: the delay is what
    remains of it now, and its fleet limits are the ones resolved when it was written."""
    job_id, name, queue, payload, priority, max_attempts, key, run_at, context, *limits = row
    slot_key, slots, rate_key, starts, per = limits
    return NewJob(
        job_id=job_id,
        name=name,
        queue=queue,
        payload=payload,
        max_attempts=max_attempts,
        priority=priority,
        delay=max(run_at - now, 0.0),
        key=key,
        limits=None
        if slot_key is None and rate_key is None
        else JobLimits(
            slot_key=slot_key,
            slots=slots or 0,
            rate_key=rate_key,
            starts=starts or 0,
            per=per or 0.0,
        ),
        context=context,
    )


@attrs.frozen
class Enqueued:
    job_id: JobId
    created: bool  # False: a live job already held the key, and job_id is that job's


@fast_init  # made for every job: see fast_init.py
@attrs.frozen
class Lease:
    """What every write of a run carries: a write whose token is no longer current is refused."""

    job_id: JobId
    token: ClaimToken


@fast_init  # made for every job: see fast_init.py
@attrs.frozen
class Claim:
    job_id: JobId
    token: ClaimToken  # fencing: every write of this run carries it
    name: str
    queue: str
    payload: str
    attempt: int  # counted at claim; an interrupted attempt hands it back
    max_attempts: int
    lease_until: float
    context: str | None = None  # as enqueued (NewJob.context)
    # Claimed ahead of a free slot (the driver was told the queue's free slots): until a renewal
    # records its start, a lapse of its lease gives its attempt back (docs/model.md, "Claiming
    # ahead"), so a worker that dies holding it costs it nothing.
    ahead: bool = False
    # The run-at it was claimed at (driver clock): when it became due, for the wait from due
    # to start (jobs_trio_wait_seconds). None from a driver that does not say.
    due_at: float | None = None
    # A suspect (orphaned rules.SUSPECT_AT times) claimed alone (claim(alone=True)): its worker
    # claims nothing beside it while it runs, so a death now is its own (X_KILLED_WORKER).
    alone: bool = False

    @property
    def lease(self) -> Lease:
        return Lease(self.job_id, self.token)


@attrs.frozen
class RenewResult:
    # Keyed by claim token, not job id: one worker can hold an older run of a job beside a
    # newer one, and only the newer one's lease is still held.
    held: frozenset[ClaimToken]  # leases still ours, now extended
    cancel_requested: frozenset[ClaimToken] = frozenset()  # an operator asked these to stop
    # Held leases whose fleet slot is no longer theirs (it lapsed and another run took it).
    slot_lost: frozenset[ClaimToken] = frozenset()
    # Still ours but NOT extended: another session held the row locked (a renewal never waits
    # for one, or one locked row would stop every run's renewal). Retried next round.
    busy: frozenset[ClaimToken] = frozenset()


# Settlements: how one attempt ends, written fenced by its lease.


@fast_init  # made for every job: see fast_init.py
@attrs.frozen
class AttemptNote:
    """What the job's attempt history keeps of an attempt beside its ending (AttemptRecord):
    given by the worker that ran it; a settlement without one adds nothing to the history."""

    attempt: int  # the attempt number it ran as (Claim.attempt)
    worker_id: str
    seconds: float | None = None  # how long its body ran; None: it never started
    traceback: str | None = None  # the tail of its error's traceback, when it raised


@fast_init  # made for every job: see fast_init.py
@attrs.frozen
class Complete:
    lease: Lease
    result: str | None = None  # JSON text
    note: AttemptNote | None = None


@attrs.frozen
class Retry:
    lease: Lease
    delay: float
    error: str
    hands_back: bool = False  # True: the attempt is handed back uncounted (interrupted)
    note: AttemptNote | None = None


@attrs.frozen
class DeadLetter:
    lease: Lease
    error: str
    note: AttemptNote | None = None


@attrs.frozen
class Suspend:
    """Wait until ``delay`` has passed, or sooner when an event named ``event`` is sent."""

    lease: Lease
    delay: float
    event: str | None = None
    # The mark of the look that found no such event (EventLook.seen). An event of the name
    # stored past it was sent while the job was still running, where the send woke nothing:
    # the settle wakes the job for it instead (rules.woken). None: no look to compare with.
    seen: str | None = None
    # The event's key the wait matches (wait_for_event's match), None for any: a send of
    # another key leaves the job asleep.
    match: str | None = None
    note: AttemptNote | None = None


@attrs.frozen
class Park:
    lease: Lease
    reason: str
    note: AttemptNote | None = None


@attrs.frozen
class CancelJob:
    lease: Lease
    error: str
    note: AttemptNote | None = None


Settlement = Complete | Retry | DeadLetter | Suspend | Park | CancelJob


@attrs.frozen
class JobRecord:
    id: JobId
    name: str
    queue: str
    state: JobState
    payload: str
    priority: int
    attempts: int
    max_attempts: int
    run_at: float
    created_at: float
    updated_at: float
    key: str | None = None
    last_error: str | None = None
    # What the body returned, as a value (its stored JSON decoded: a dict, a list, a str, ...),
    # None before it completed or when it returned None. Text that is not JSON (a row written
    # by hand) comes back as the text.
    result: Any = None
    lease_until: float | None = None
    worker_id: str | None = None
    cancel_requested: bool = False
    wait_event: str | None = None
    context: str | None = None  # as enqueued (NewJob.context)
    # Its fleet limits as enqueued (JobLimits, docs/limits.md), None where it has none, and
    # what it waits for while a claim has put it off for one: "slot:KEY" or "rate:KEY".
    slot_key: str | None = None
    slots: int | None = None
    rate_key: str | None = None
    starts: int | None = None
    per: float | None = None
    waiting_on: str | None = None
    # Suspended waiting for an event: the key it waits for (wait_for_event's match), None for
    # any. A send of another key does not wake it (every waiter of a name woke for every send).
    wait_key: str | None = None
    # How many times a worker died under it (its lease lapsed and a claim handed it back),
    # counted apart from ``attempts``: from rules.SUSPECT_AT on it runs only alone on a worker.
    orphans: int = 0

    @property
    def limits(self) -> JobLimits | None:
        if self.slot_key is None and self.rate_key is None:
            return None
        return JobLimits(
            slot_key=self.slot_key,
            slots=self.slots or 0,
            rate_key=self.rate_key,
            starts=self.starts or 0,
            per=self.per or 0.0,
        )

    def to_json(self) -> dict[str, object]:
        # Every field, by the class's own list (the drivers' column list is made from it too).
        return {**attrs.asdict(self, recurse=False), "state": self.state.value}


@attrs.frozen
class QueueStats:
    queue: str
    depth: Mapping[str, int]  # state value -> count
    due: int  # ready jobs whose run-at has come
    oldest_ready_age: float | None  # seconds the oldest due job has waited
    dead: int
    # Ready jobs a claim put off for a fleet limit: (job name, "slot" or "rate", count).
    limit_waiting: tuple[tuple[str, str, int], ...] = ()
    # An operator paused it (QueuePause): nothing of it starts until it is resumed. A paused
    # queue is listed even when it holds no job.
    paused: bool = False


@attrs.frozen
class QueuePause:
    """A queue an operator paused, fleet-wide and durably: from the pause's commit no claim
    takes a job of it (nor rescues a lapsed one) until it is resumed, and a worker hands back
    unstarted the jobs of it it holds; the jobs already running in it finish (docs/model.md,
    "Pausing a queue")."""

    queue: str
    paused_at: float  # driver clock
    by: str | None = None  # who paused it, as they gave it (the CLI: user@host)
    # The change of the fleet's pauses that made it (PauseLook.epoch; 0 for one made before
    # epochs were counted): a worker that confirmed this epoch or a later one has heard it.
    epoch: int = 0

    def to_json(self) -> dict[str, object]:
        return attrs.asdict(self, recurse=False)


@attrs.frozen
class PauseLook:
    """The paused queues as one read saw them, with that state's ``epoch``: the count of every
    pause and resume ever made, each change one more. A worker confirms the epoch of a look
    once it has acted on it (``Driver.pauses_heard``): every change up to it is heard there."""

    epoch: int
    pauses: tuple[QueuePause, ...]


@attrs.frozen
class PauseHolder:
    """A worker the database has holding jobs of a queue (``Driver.pause_holders``): running
    ones, and ones claimed for a slot and not yet started, which only it can tell apart. What
    a pause waits to hear from before it is sure nothing of the queue starts."""

    worker_id: str
    jobs: int
    lease_until: float  # the latest lease among them, driver clock
    # The latest pause epoch it confirmed (PauseLook.epoch); None: never (a worker of a release
    # that does not confirm, or one that has not looked yet).
    heard: int | None


class StepStatus(enum.StrEnum):
    DONE = "done"
    SLEEPING = "sleeping"
    WAITING = "waiting"


@attrs.frozen
class StepRecord:
    name: str
    status: StepStatus
    started_at: float
    finished_at: float | None = None
    result: str | None = None  # JSON text once done
    wake_at: float | None = None  # sleeping / waiting: when to look again at the latest
    event: str | None = None  # waiting: the event name
    match: str | None = None  # waiting: the event key to match, if any

    def to_json(self) -> dict[str, object]:
        return {**attrs.asdict(self, recurse=False), "status": self.status.value}


@attrs.frozen
class AttemptRecord:
    """One ended attempt of a job, as its history keeps it: the newest ATTEMPT_HISTORY
    (drivers/rules.py) endings written with a note, oldest first. ``outcome`` is an
    OutcomeKind's value (an operator's pending cancel makes it ``cancelled``); ``error`` is the
    text the ending stored (None for a completion or a suspension)."""

    seq: int  # the job's how-manieth ending (settled attempt): the order, across retries too
    attempt: int
    outcome: str
    worker_id: str | None
    ended_at: float  # when its settlement was written (driver clock)
    seconds: float | None = None
    error: str | None = None
    traceback: str | None = None

    def to_json(self) -> dict[str, object]:
        return attrs.asdict(self, recurse=False)


@attrs.frozen
class OutcomeCount:
    """How many recorded attempts ended as ``outcome`` in the ``bucket`` seconds from ``start``
    (driver clock): the dashboard's throughput and failure charts."""

    start: float
    outcome: str
    count: int


@attrs.frozen
class NameStats:
    """The recorded attempts of one job name that ended at or after a time: how many ended as
    each outcome (OutcomeKind's values), and how long the bodies that ran took. The dashboard's
    run time and failure rate per job name."""

    name: str
    outcomes: Mapping[str, int]  # outcome value -> attempts
    timed: int  # attempts whose body ran (a run time recorded)
    seconds: float  # their run time, summed
    longest: float | None  # the longest of them; None when none ran

    @property
    def mean_seconds(self) -> float | None:
        return None if not self.timed else self.seconds / self.timed

    @property
    def failure_rate(self) -> float | None:
        """Failed (retried or dead-lettered) attempts among those that completed or failed."""
        failed = self.outcomes.get("retried", 0) + self.outcomes.get("dead-lettered", 0)
        ended = failed + self.outcomes.get("completed", 0)
        return None if not ended else failed / ended


@attrs.frozen
class WorkerPresence:
    """A running worker as it announces itself to the fleet every ``every`` seconds (its
    stats interval): the dashboard lists those seen within two of their intervals."""

    worker_id: str
    host: str
    pid: int
    queues: tuple[str, ...]
    concurrency: int  # slots over all its queues
    running: int
    state: str  # WorkerState's value
    version: str  # the jobs_trio release it runs: a fleet mid-deploy shows two
    started_at: float
    seen_at: float
    every: float
    # What its registry declares: (job name, queue, attempts), by name. `jobs-trio enqueue`
    # checks a name against the fleet's (and takes its queue and attempts from them).
    jobs: tuple[tuple[str, str, int], ...] = ()

    def live(self, now: float) -> bool:
        """Seen within two intervals (and a little for a slow round trip): a worker killed
        without its goodbye drops off the list by then."""
        return now - self.seen_at <= 2 * self.every + 5

    def to_json(self) -> dict[str, object]:
        return {
            **attrs.asdict(self, recurse=False),
            "queues": list(self.queues),
            "jobs": [list(job) for job in self.jobs],
        }


@attrs.frozen
class RelayHold:
    """The outbox rows one relay holds (outbox_claim): taken, their jobs not yet written or
    their rows not yet deleted. A hold whose lease has ended (``until`` past) belongs to a relay
    that died or is paused: another relay takes its rows over, and fences its write."""

    relay_id: str
    rows: int
    until: float  # the latest lease among them, on the outbox's clock

    def lapsed(self, now: float) -> bool:
        return self.until <= now

    def to_json(self, now: float) -> dict[str, object]:
        return {
            "relay_id": self.relay_id,
            "rows": self.rows,
            "lease_left": round(self.until - now, 3),
            "lapsed": self.lapsed(now),
        }


@attrs.frozen
class OutboxStats:
    """The outbox of one database: rows written by committed transactions, not yet relayed."""

    pending: int
    oldest_age: float | None  # seconds the oldest pending row has waited: the relay's lag
    # The rows relays hold, by relay id (live holds and lapsed ones alike); the rest of the
    # pending rows are free for the next pass.
    held: tuple[RelayHold, ...] = ()


@attrs.frozen
class OutboxBatch:
    """The rows one relay took from an outbox (outbox_claim) under its ``ticket``, and the
    tickets of every relay that held any of them before (``superseded``: their leases lapsed,
    they died or are paused). The job store refuses those relays' writes from the moment this
    batch's write is made (relay_enqueue), so a paused relay that wakes writes nothing."""

    jobs: tuple[NewJob, ...]
    ticket: str
    superseded: tuple[str, ...] = ()


class RelayOutcome(enum.StrEnum):
    """What became of one outbox row in the job store, decided once (relay.py)."""

    CREATED = "created"  # its job was written, under the row's own id
    KEY_HELD = "key-held"  # a live job held its key when it was relayed: no job of its own

    def __str__(self) -> str:
        return self.value


@attrs.frozen
class RelayDecision:
    """One outbox row's decision, as the job store records it (with the job, in one
    transaction) and answers it again for as long as the row may be taken again."""

    job_id: JobId  # the outbox row's id: the id its job has, when one was written
    outcome: RelayOutcome
    holder: JobId  # the job that stands for the row: its own, or the key's live holder then
    decided_at: float  # on the job store's clock
    # Decided by an earlier pass (a relay that died before deleting the row, or another relay):
    # this pass found the decision on record and changed nothing.
    already: bool = False


@attrs.frozen
class EventRecord:
    id: str
    name: str
    key: str | None
    payload: str  # JSON text
    created_at: float


@attrs.frozen
class EventLook:
    """A waiting step's look for its event: the earliest match, and a mark of what the look
    could see of the name, taken in the same read. The suspension that follows a look that
    found nothing carries the mark (Suspend.seen), so that its settle sees a send that landed
    between the look and the suspend, when no job was suspended on the name for it to wake."""

    found: EventRecord | None
    # What the look could see of the name, of any key or time, as its driver marks it: memory
    # and SQLite, the id of the newest event ("0": none); PostgreSQL, the look's snapshot.
    # Past every event the look read, so a re-look's mark covers the events that woke it and
    # an event of another key wakes the job once, never in a loop.
    seen: str


# Cron tasks: the durable record that makes a scheduled time fire once per fleet.


@attrs.frozen
class TaskMark:
    """A task's record: every scheduled time up to ``handled_until`` is done, fired or skipped
    by the missed-run policy; only a compare-and-set moves it, and only forwards."""

    task: str
    handled_until: float
    last_fired: float | None = None  # the scheduled time the latest fire stands for
    last_fired_at: float | None = None  # when (driver clock) that fire was enqueued
    last_job_id: JobId | None = None


@attrs.frozen
class TaskFire:
    scheduled: float  # the scheduled time this fire stands for
    job: NewJob


@attrs.frozen
class TaskAdvance:
    """Move ``task``'s mark from ``expected`` (None: no record yet) to ``advance_to`` and enqueue
    ``fires``, all or nothing."""

    task: str
    expected: float | None
    advance_to: float
    fires: tuple[TaskFire, ...] = ()


@attrs.frozen
class PruneTurn:
    """One bounded batch of retention, asked for by ``holder``. The driver deletes up to
    ``limit`` finished jobs and their step records: completed and cancelled ones last changed
    more than ``keep_finished`` seconds ago, dead ones more than ``keep_dead`` (None: dead jobs
    are kept). A live job (ready, running, suspended, parked) is never deleted.

    One pruner at a time in a fleet: the batch runs only if ``holder`` holds the turn or takes
    it (a compare-and-set on one row): a turn is free once its holder has not come back for
    ``hold`` seconds, and is taken only ``every`` seconds after the last turn ended (0: at once,
    the CLI's way)."""

    holder: str
    keep_finished: float
    keep_dead: float | None
    limit: int = 1000
    hold: float = 60.0
    every: float = 0.0


@attrs.frozen
class Pruned:
    """What one ``prune`` call did. ``turn`` False: another pruner holds the turn, or the last
    turn ended less than ``every`` seconds ago; nothing was deleted. ``more``: the batch was
    full, so more may be due; the caller still holds the turn and calls again. A batch that
    was not full ends the turn."""

    turn: bool
    deleted: int = 0
    more: bool = False
