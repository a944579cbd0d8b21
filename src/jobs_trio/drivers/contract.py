# The one interface every storage backend implements (memory, SQLite, PostgreSQL): six capabilities,
# each a room of every driver's package and a file prefix of jobs_trio.testing.conformance.
# Imported as `jobs_trio.driver` (or `jobs_trio.Driver`), its public name.
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

import attrs

from .._core.records import (
    AttemptRecord,
    Claim,
    ClaimToken,
    Enqueued,
    EventLook,
    JobId,
    JobRecord,
    JobState,
    Lease,
    NameStats,
    NewJob,
    OutboxBatch,
    OutboxStats,
    OutcomeCount,
    PauseHolder,
    PauseLook,
    Pruned,
    PruneTurn,
    QueuePause,
    QueueStats,
    RelayDecision,
    RenewResult,
    Settlement,
    StepRecord,
    TaskAdvance,
    TaskMark,
    WorkerPresence,
)


@attrs.frozen
class Capabilities:
    """What a driver declares it does beyond the core contract (River's driver does the same).
    A worker uses each only where its driver declares it; the conformance suite tests each one
    declared and skips the rest. A driver declares them all or none: every default is off."""

    # settle_and_claim (SettlesWithClaims): a worker's settlements written by its next claim,
    # one round trip where there were two.
    settles_with_claims: bool = False
    # claim(free=) and renew(started=): claims taken ahead of a free slot, marked so that a
    # worker that dies holding them costs them no attempt (Worker's claim_ahead).
    claims_ahead: bool = False
    # claim(rescue=False): a claim that takes no lapsed job (a worker just back from an outage).
    rescue_on_request: bool = False
    # claim(alone=) and wait_for_work(alone=): the orphan rule's suspects (rules.is_suspect)
    # claimed only by a worker that runs nothing else, one at a time (docs/model.md, "A
    # worker's death"). A driver without it never hands a lapsed job back uncounted.
    claims_alone: bool = False
    # beside() (RenewsBeside): a connection for the worker's lease lifeline, so that a body
    # blocking the Trio loop does not cost the worker its leases.
    renews_beside: bool = False
    # hand_back_unheld() (HandsBackUnheld): the jobs of a claim whose answer its worker never
    # received given their attempts back (issue 32: an outage cut the claim's reply).
    hands_back_unheld: bool = False
    # unmark_alone() (UnmarksAlone): a suspect's run its worker abandoned at a drain's grace
    # is no longer alone, so its lapse orphans it instead of dead-lettering it X_KILLED_WORKER.
    unmarks_alone: bool = False
    # Claims answered side by side (a pool of connections, a server that runs them at once):
    # a worker with work waiting sends its next claim before the last one is answered.
    claims_side_by_side: bool = False

    @classmethod
    def every(cls, **but: bool) -> Capabilities:
        """Every capability declared, save those ``but`` turns off: a driver that has nearly all
        says what it lacks (``Capabilities.every(claims_side_by_side=False)``)."""
        return cls(**{field.name: True for field in attrs.fields(cls)} | but)


class Jobs(Protocol):
    """A job's way from written to ended: enqueue, claim, renew, settle, and the wait for work
    between claims (conformance: test_jobs_*)."""

    async def enqueue(
        self, jobs: Sequence[NewJob], *, connection: object | None = None
    ) -> Sequence[Enqueued]:
        """Write ``jobs`` in one go, in order. A job whose key a live job already holds is not
        written: its answer carries the live job's id and ``created=False``. ``connection``
        enlists the write in the caller's own transaction where the driver supports that."""
        ...

    async def claim(
        self,
        queues: Sequence[str],
        limit: int | Mapping[str, int],
        *,
        lease: float,
        worker_id: str,
        free: Mapping[str, int] | None = None,
        rescue: bool = True,
        alone: bool = False,
    ) -> Sequence[Claim]:
        """Take up to ``limit`` due jobs (lowest priority number, then earliest run-at). Each
        gets a fresh token, ``attempts + 1`` and a lease of ``lease`` seconds.

        First, up to ``limit`` jobs whose lease has lapsed are handed back (none with
        ``rescue=False``: a worker just back from an outage leaves them to their runners for a
        while, see outage.py), each at its place in line: orphaned by the rule
        (``rules.orphaning``: its attempt given back, one more orphaning; dead-lettered when it
        ran alone or was orphaned ``rules.ORPHAN_LIMIT`` times), recorded in its history
        (outcome ``orphaned``) and logged (``jobs.attempt.orphaned``). Then the claim takes
        due jobs as any, those it handed back included, at their place in line (PostgreSQL
        claims them with a second statement in the same call: the first one's snapshot is
        older than its hand-back).

        Suspects (``rules.is_suspect``: orphaned twice) are taken only with ``alone=True`` (the
        worker runs nothing else and has no other claim in flight), and then the first due one
        alone, nothing beside it (``Claim.alone``); a claim ``alone`` with no suspect due
        claims as any.

        A mapping ``limit`` caps each queue on its own (``claim_slots.ClaimSlots``): one
        claim then serves all of a worker's queues, each up to its own free slots.

        ``free`` (given only by a worker that claims ahead) is each queue's free slots: a
        queue's claims past that many (without fleet limits) are marked ``Claim.ahead``, and a
        lapsed job so marked, never recorded started (``renew(started=)``), is handed back as
        it was, not orphaned, at most ``max_attempts`` times in its life
        (``rules.hands_back_lapse``; past that it is orphaned as any): it never ran, so its
        worker's death cannot be its doing."""
        ...

    async def renew(
        self, leases: Sequence[Lease], *, lease: float, started: Sequence[ClaimToken] = ()
    ) -> RenewResult:
        """Extend every lease whose token is still current, in one statement; answer which
        were held and which an operator asked to cancel. ``started`` (tokens of claims marked
        ahead whose bodies have since started) records those starts: their attempts count
        from here whatever ends them."""
        ...

    async def settle(self, settlements: Sequence[Settlement]) -> Sequence[JobId]:
        """Apply each settlement whose token is still current; answer the ids applied. A stale
        token changes nothing (fencing). With an operator's cancel pending, an ending that would
        leave the job live ends it cancelled (``operator_transitions.cancel_instead``)."""
        ...

    async def wait_for_work(
        self,
        queues: Sequence[str],
        timeout: float,
        *,
        rescue_from: float | None = None,
        alone: bool = False,
    ) -> None:
        """Return when a job in ``queues`` may have become claimable, or after ``timeout``.
        One look at the next due time for all ``queues`` at most; then a driver that hears
        every change wakes on it (memory: in-process; PostgreSQL: LISTEN), and one that cannot
        (SQLite across processes; PostgreSQL while its LISTEN is down) looks again on its own
        short interval, so ``timeout`` can be a slow safety poll. ``rescue_from`` (given only
        with ``Capabilities.rescue_on_request``, by a worker that takes no lapsed job until
        then, on the driver's clock): a lapsed lease is work only from that moment. A suspect
        (``rules.is_suspect``) is work only for a wait ``alone`` (``Capabilities.claims_alone``,
        as ``claim(alone=)``): else a busy worker would wake for a job it may not take."""
        ...


class StepsAndEvents(Protocol):
    """Durable steps (fenced saves) and the events a suspended job waits for
    (conformance: test_steps_events_*)."""

    async def load_steps(self, job_id: JobId) -> Sequence[StepRecord]: ...

    async def save_step(
        self, lease: Lease, step: StepRecord, *, connection: object | None = None
    ) -> bool:
        """Insert or replace one step record, fenced: False (and nothing written) when the
        lease's token is no longer the job's current one.

        ``connection`` (a ``jobs_trio.transaction`` on this driver) writes it in the caller's
        transaction (``step.transaction``): the token is checked there under a lock that every
        claim of the job must also take (PostgreSQL: the job's row FOR KEY SHARE; SQLite: the
        file's write lock), held until that transaction ends, so no other worker takes the job
        over between the check and the commit. A driver without transactions refuses it
        (``ConfigError``)."""
        ...

    async def send_event(
        self, name: str, payload: str, *, key: str | None = None, connection: object | None = None
    ) -> str:
        """Store an event and make every job suspended on ``name`` ready now."""
        ...

    async def look_for_event(self, name: str, *, key: str | None, since: float | None) -> EventLook:
        """One read: the earliest event named ``name`` (with ``key``, when given) sent at or
        after ``since`` (any time when None), and the mark of what it could see of ``name``
        that a suspension after it carries (Suspend.seen): its settle makes the job ready now
        when an event of the name was stored past the mark (rules.woken)."""
        ...


class Cron(Protocol):
    """Cron tasks' marks: each tick fired once per fleet (conformance: test_cron_*)."""

    async def task_marks(self) -> Sequence[TaskMark]:
        """Every cron task's record, by task name."""
        ...

    async def advance_task(self, advance: TaskAdvance) -> bool:
        """Compare-and-set, in one transaction: when the task's record still says
        ``advance.expected`` (or, with None, there is none) and no fire of the same task and
        scheduled time is on record, move it to ``advance_to``, record each fire and enqueue its
        job. Answers whether it applied; False wrote nothing (another worker got there first)."""


class OutboxAndRelay(Protocol):
    """The transactional outbox and the relay that moves its rows into jobs, fenced by
    tickets (conformance: test_outbox_relay*)."""

    # The outbox: jobs an application wrote in its own transaction, in its own database, for a
    # relay to move into the job store (see relay.py). A driver opened on the application's
    # database serves its outbox (outbox_*); the job store's driver takes the rows and records
    # what became of each (relay_*), so that a row taken twice is decided once.

    async def outbox_write(
        self, jobs: Sequence[NewJob], *, connection: object | None = None
    ) -> None:
        """Store ``jobs`` in this database's outbox, inside the caller's transaction when
        ``connection`` (or a ``jobs_trio.transaction``) is given: they exist for the relay
        once, and only if, that transaction commits. Each keeps its id, delay, key, fleet
        limits and context."""
        ...

    async def outbox_claim(
        self, limit: int, *, lease: float, relay_id: str, ticket: str
    ) -> OutboxBatch:
        """Take up to ``limit`` outbox rows, oldest first, for ``lease`` seconds, skipping rows
        another relay holds under a live lease; a row whose lease lapsed (its relay died or is
        paused) is taken again. Each row taken is marked with ``ticket`` (``relay_ticket``, from
        the job store); the batch answers, beside the jobs, the ticket of every relay that held
        one of them before, since the row was written (``OutboxBatch.superseded``). Each job's
        ``delay`` is what remains of its delay now."""
        ...

    async def outbox_delete(
        self, job_ids: Sequence[JobId], *, ticket: str | None = None
    ) -> Sequence[JobId]:
        """Remove relayed rows; answer the ids removed. With ``ticket``, only the rows still
        marked with it: a row another relay took over since is its to finish, and its decision
        must outlive this relay's pass (the relay forgets only the decisions of rows it
        removed)."""
        ...

    async def outbox_present(self, job_ids: Sequence[JobId]) -> Sequence[JobId]:
        """Which of ``job_ids`` are rows of this outbox now (relayed or not)."""
        ...

    async def outbox_stats(self) -> OutboxStats: ...

    async def outbox_source(self) -> str:
        """Who this outbox is: an id made once by the migration that made the outbox, the same
        for every driver opened on this database (and schema), another for any other."""
        ...

    async def relay_ticket(self, source: str, *, relay_id: str, lease: float) -> str:
        """A new ticket for a relay of ``source``'s outbox: the fencing token of the batch it
        takes next (``outbox_claim(ticket=)``), recorded HERE, in the job store, before any row
        is taken under it, so that a relay taking one of those rows over can revoke it in the
        job store's own transaction (``relay_enqueue(superseded=)``). Tickets of ``source``
        recorded more than ``rules.STALE_TICKET_LEASES`` of their leases ago are forgotten on
        the way (their relays died idle, or were fenced long ago): a write under one is refused,
        which costs its rows no more than a lease's wait."""
        ...

    async def relay_enqueue(
        self,
        jobs: Sequence[NewJob],
        *,
        source: str,
        ticket: str,
        superseded: Sequence[str] = (),
    ) -> Sequence[RelayDecision]:
        """The relay's write of outbox rows taken from ``source``'s outbox under ``ticket``:
        each row decided ONCE. Fenced, in the write's own transaction: the ``superseded``
        tickets (the relays that held these rows before) are revoked first, then ``ticket`` is
        spent; a ticket not on record (revoked: another relay took one of its rows over; or
        forgotten as stale) refuses the whole write with ``RelayFenced`` and changes nothing.
        A row with a decision on record is answered from it (``already=True``) and nothing is
        written, whatever became of its job since (finished, pruned) or of its key. Any other
        row is decided now, as ``enqueue`` would: its job written under the row's id
        (created), or not when a live job holds its key (key-held, that job the holder); the
        jobs and the decisions commit together. A decision is kept until ``relay_forget``."""
        ...

    async def relay_forget(self, source: str, job_ids: Sequence[JobId]) -> int:
        """Delete the decisions of ``source``'s rows ``job_ids`` (the rows are gone from its
        outbox, so none can be taken again); answer how many there were."""
        ...

    async def relay_decisions(self, source: str, *, before: float, limit: int) -> Sequence[JobId]:
        """Up to ``limit`` ids of ``source``'s rows decided before ``before`` (the driver's
        clock), oldest first: the decisions a relay that died before forgetting them left, for
        a sweep to forget once their rows are gone (``outbox_present``)."""
        ...

    async def shares_outbox(self, outbox: Driver) -> bool:
        """Whether ``outbox``'s rows are in this driver's own database (a relay then moves
        them with ``relay_in_place``). False when that cannot be told for certain: the
        two-step way is exactly-once too, only with a decision to record."""
        ...

    async def relay_in_place(self, outbox: Driver, limit: int) -> Sequence[RelayDecision]:
        """For an ``outbox`` this driver shares (``shares_outbox``): in ONE transaction, take up
        to ``limit`` of its rows oldest first (skipping rows another relay is taking, or holds
        under a live lease), write their jobs as ``relay_enqueue`` decides them, and delete the
        rows (with any decision on record for them, and revoking the ticket of every two-step
        relay that held one: it may wake from a pause and write). A relay that dies anywhere
        in it leaves everything as it was: no window, and nothing recorded."""
        ...


class Fleet(Protocol):
    """What the workers tell each other: presence and the queues' pauses (conformance:
    test_fleet_*)."""

    # Queue control: a pause is durable and fleet-wide (docs/model.md, "Pausing a queue").

    async def pause_queue(self, queue: str, *, by: str | None = None) -> QueuePause:
        """Pause ``queue``: no claim ordered after this call's commit takes a job of it (nor a
        lapsed one to rescue) until ``resume_queue``, and ``wait_for_work`` counts none of its
        jobs as work; the jobs running in it run on. The change counts one more epoch (the
        answer's ``epoch``, ordered as the changes commit), and waiters in ``wait_for_pauses``
        wake. Pausing a paused queue changes nothing and answers the pause on record; a queue
        with no jobs can be paused (its jobs then wait from their enqueue). The workers holding
        jobs of it hear of it afterwards: ``jobs_trio.pause_queue`` waits for them."""
        ...

    async def resume_queue(self, queue: str) -> bool:
        """Take ``queue``'s pause back; answer whether it was paused (a resume counts one more
        epoch). Waiters for work in it and in ``wait_for_pauses`` wake."""
        ...

    async def queue_pauses(self) -> Sequence[QueuePause]:
        """Every paused queue, by name."""
        ...

    async def wait_for_pauses(self, seen: int | None, timeout: float) -> PauseLook:
        """The paused queues and their epoch, read in one snapshot: answered at once when the
        epoch is not ``seen`` (a worker's last look; None: answer at once), else once it
        changes, or as they are after ``timeout`` seconds. A driver that hears every change
        wakes on it (memory: in-process; PostgreSQL: LISTEN); one that cannot (SQLite across
        processes; PostgreSQL while its LISTEN is down) looks again on its own short
        interval, as ``wait_for_work`` does."""
        ...

    async def pauses_heard(self, worker_id: str, epoch: int) -> None:
        """A worker's confirmation that it acts on the pauses as of ``epoch`` (a look's): it
        holds no job of a queue paused by then unstarted, and starts none until it is resumed.
        Replaces its previous one; forgets those of workers silent for
        ``rules.FORGET_WORKERS_AFTER`` seconds."""
        ...

    async def pause_holders(self, queue: str) -> Sequence[PauseHolder]:
        """Every worker the database has holding running jobs of ``queue`` (by worker id), with
        how many, their latest lease, and the epoch it last confirmed (``pauses_heard``). Once
        ``queue`` is paused no claim adds one: a pause is sure nothing of it starts anywhere
        once each of these has confirmed the pause's epoch."""
        ...

    async def worker_seen(self, presence: WorkerPresence) -> None:
        """Store a worker's announcement, replacing its previous one; forget every worker not
        seen for ``rules.FORGET_WORKERS_AFTER`` seconds."""
        ...

    async def worker_gone(self, worker_id: str) -> None:
        """Forget a worker that stopped (nothing when it is not recorded)."""
        ...

    async def workers(self) -> Sequence[WorkerPresence]:
        """Every worker recorded, by worker id, live or not (``WorkerPresence.live`` tells)."""
        ...


class Admin(Protocol):
    """What operators read and do: jobs, operator transitions, stats, history, retention
    (conformance: test_admin_*)."""

    async def get(self, job_id: JobId) -> JobRecord | None: ...

    async def list_jobs(
        self,
        *,
        state: JobState | None = None,
        queue: str | None = None,
        name: str | None = None,
        changed_before: float | None = None,
        limit: int = 100,
    ) -> Sequence[JobRecord]:
        """Newest first; jobs of one batch (equal ``created_at``) by id, descending. Each
        filter given narrows the list: ``name`` is a job's whole name, ``changed_before`` a
        time its ``updated_at`` is before (driver clock)."""
        ...

    async def retry(self, job_id: JobId) -> JobRecord:
        """An operator's re-run: a dead, cancelled or parked job back to ready now, with its
        attempts reset. Raises ``JobNotFound`` / ``InvalidTransition``."""
        ...

    async def cancel(self, job_id: JobId) -> JobRecord:
        """An operator's cancel: a ready, suspended or parked job becomes cancelled at once; a
        running one is flagged, and its worker cancels the run at its next renewal."""
        ...

    async def delete(self, job_id: JobId) -> JobRecord:
        """An operator's delete of a job that is not running: the job, its step records and
        its attempt history are gone, its key is free. Answers the job as it was. Raises
        ``JobNotFound`` / ``InvalidTransition`` (a running job: cancel it first)."""
        ...

    async def run_now(self, job_id: JobId) -> JobRecord:
        """An operator's "run now": a ready job whose run-at is ahead (scheduled, backing off,
        put off for a fleet limit) due now, its attempts unchanged; waiters for work in its
        queue wake. A ready job already due is answered as it is. Raises ``JobNotFound`` /
        ``InvalidTransition`` (any other state)."""
        ...

    async def stats(self) -> Sequence[QueueStats]:
        """Per queue (by name) with jobs or paused: its jobs by state, due, the oldest due
        job's age, its dead jobs, whether it is paused."""
        ...

    async def fleet_stats(self, worker_id: str, interval: float) -> Sequence[QueueStats]:
        """``stats()`` for a fleet's workers to export: the first caller after ``interval``
        seconds since the last turn reads ``stats()`` and stores it; every other caller gets
        the stored observation from a one-row read (see _fleet_stats.py)."""
        ...

    async def prune(self, turn: PruneTurn) -> Pruned:
        """One bounded batch of retention (see ``PruneTurn``): delete finished jobs past their
        age, with their step records, in one transaction with the turn's compare-and-set, so
        two pruners never delete at once and a job changed since (an operator's retry) stays."""
        ...

    # What operators read of the fleet's recent past (the dashboard): each job's attempt history
    # and the workers that announce themselves.

    async def load_attempts(self, job_id: JobId) -> Sequence[AttemptRecord]:
        """The job's attempt history, oldest first: every settlement applied with a note
        (``AttemptNote``) added one record, in the settlement's own write; the newest
        ``rules.ATTEMPT_HISTORY`` are kept, and none outlives its job (retention)."""
        ...

    async def outcome_counts(self, since: float, bucket: float) -> Sequence[OutcomeCount]:
        """The recorded attempts that ended at or after ``since``, counted by outcome in
        ``bucket``-second buckets (each starting at a multiple of ``bucket``), oldest first; a
        bucket with none of an outcome is left out. One read, whatever the number of queues."""
        ...

    async def name_stats(self, since: float) -> Sequence[NameStats]:
        """The recorded attempts that ended at or after ``since``, per job name (by name): by
        outcome, and the run time of those whose body ran. One read, whatever the number of
        names; an attempt whose job was deleted (or pruned) is gone with it."""
        ...


@runtime_checkable
class Driver(Jobs, StepsAndEvents, Cron, OutboxAndRelay, Fleet, Admin, Protocol):
    """Durable job storage. Every method is async and safe to call from one Trio task at a time
    or from many; times are seconds on the driver's own clock (``now()``)."""

    url: str
    capabilities: Capabilities

    def now(self) -> float:
        """The driver's clock: every run-at, lease and timestamp it stores is on it."""
        ...

    async def aclose(self) -> None: ...


class SettlesWithClaims(Protocol):
    """What a driver may add to ``Driver``: a worker's settlements written by its next claim,
    one round trip where there were two (issue 16). A worker uses it when its driver has it;
    a driver without it is settled and claimed apart, with the same outcomes."""

    async def settle_and_claim(
        self,
        settlements: Sequence[Settlement],
        queues: Sequence[str],
        limit: int | Mapping[str, int],
        *,
        lease: float,
        worker_id: str,
        free: Mapping[str, int] | None = None,
        rescue: bool = True,
        alone: bool = False,
    ) -> tuple[Sequence[JobId], Sequence[Claim]]:
        """``settle(settlements)`` then ``claim(queues, limit, ...)`` as ONE write: both commit
        or neither does, so a refused or failed call leaves every settlement to be written
        again. Answers what each would have answered: a run it settles is never also claimed
        as a lapsed lease (its lapse is the settlement's, not a candidate's), and a job it made
        due now (a retry or suspension without delay, a freed fleet slot's waiter) is a
        candidate as it would be for a claim after the settle."""
        ...


class BesideConnection(Protocol):
    """A driver's second way to its store, for the worker's lease lifeline (lease_lifeline.py):
    used from ONE thread that is not the Trio thread, one call at a time, on a connection of
    its own opened at its first call. Every call is bounded (the driver's statement and lock
    timeouts) and raises ``JobsError`` when the store cannot be reached."""

    def renew(self, leases: Sequence[Lease], *, lease: float) -> frozenset[ClaimToken]:
        """``Driver.renew``'s extension, answering the tokens still held."""
        ...

    def settle(self, settlements: Sequence[Settlement]) -> Sequence[JobId]:
        """``Driver.settle``, fenced the same way."""
        ...

    def close(self) -> None: ...


class HandsBackUnheld(Protocol):
    """What a driver may add to ``Driver``: a worker whose claim failed with no answer (the
    connection dropped while it was in flight) may have had that claim commit, and its jobs
    would lapse a lease later and each be charged an attempt for an outage."""

    async def hand_back_unheld(
        self, worker_id: str, queues: Sequence[str], held: Sequence[ClaimToken]
    ) -> Sequence[JobId]:
        """Every running job of ``queues`` claimed by ``worker_id`` whose token is not in
        ``held`` (the worker never learned it) is made lapsed now and marked ahead: the next
        claim, anyone's, takes it with its attempt given back, within the bound of
        ``rules.hands_back_lapse``. Answers their ids. Only a worker that is alive calls it,
        for its own id: a job that kills its worker is never handed back this way."""
        ...


class UnmarksAlone(Protocol):
    """What a driver may add to ``Driver``: a worker that abandons a suspect's body at its
    drain's grace (the body ignored its cancellation) exits without settling it, and the lapse
    of a run claimed alone reads as the job having killed its worker (X_KILLED_WORKER), though
    a deploy ended it (docs/model.md, "A worker's death")."""

    async def unmark_alone(self, leases: Sequence[Lease]) -> Sequence[JobId]:
        """The run of each lease whose token is still current is no longer marked alone
        (``Claim.alone``), and nothing else changes: it stays running under its lease, which
        lapses as any, and the claim that then finds it orphans it (``rules.orphaning``, within
        ``ORPHAN_LIMIT``) instead of dead-lettering it. Answers the ids whose token held; a
        stale token (a run settled, or claimed again after a lapse) changes nothing."""
        ...


class RenewsBeside(Protocol):
    """What a driver may add to ``Driver``: a connection a thread can use while the Trio loop
    cannot (a job body that blocks it): a worker on such a driver keeps its leases through the
    block instead of losing every job it holds to another worker (issue 32)."""

    def beside(self) -> BesideConnection:
        """A new, unopened connection for one thread; the caller closes it."""
        ...
