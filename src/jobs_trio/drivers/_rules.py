# The rules every driver shares, each said once: which states hold a unique key, what each kind
# of settlement does to its job, and the words of shared refusals (how rows map to records:
# _rows.py).
# Apart so that drivers import rules, never each other; the SQL drivers render these into SQL.
from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

import attrs

from .._core.errors import ConfigError, KilledWorker, OrphanedTooOften, RelayFenced
from .._core.logs import log_event
from .._core.operator_transitions import OPERATOR_CANCEL_ERROR
from .._core.records import ORPHAN_LIMIT as ORPHAN_LIMIT  # the rule's numbers, said there
from .._core.records import SUSPECT_AT as SUSPECT_AT
from .._core.records import (
    WAITING_STATES,
    AttemptRecord,
    CancelJob,
    Complete,
    DeadLetter,
    JobRecord,
    JobState,
    NameStats,
    NewJob,
    OutcomeKind,
    Park,
    QueueStats,
    Retry,
    Settlement,
    Suspend,
)

# A unique key is held while its job can still run; a finished job frees it. In this order in
# every SQL the drivers run (`LIVE_STATES_SQL`): SQLite matches an upsert's conflict target to
# the partial index by the text of its WHERE, so the list must read as the index's does.
LIVE_STATES: Final = (JobState.READY, JobState.RUNNING, JobState.SUSPENDED, JobState.PARKED)


def sql_list(states: Iterable[JobState]) -> str:
    """``states`` as an SQL list of string literals: ``('ready', 'running')``. The values are
    the enum's own, never a caller's text."""
    return "(" + ", ".join(f"'{JobState(state).value}'" for state in states) + ")"


LIVE_STATES_SQL: Final = sql_list(LIVE_STATES)

# A key with a window (NewJob.unique_for) is held also by a job of the key created within the
# window in one of these finished states (the live ones hold it anyway): by default a
# completed one ("one welcome mail per user per day"); a dead or cancelled one only when asked,
# so that a failed job can be enqueued again (River's and Oban's defaults too).
WINDOW_STATES: Final = (JobState.COMPLETED, JobState.DEAD, JobState.CANCELLED)
DEFAULT_WINDOW_STATES: Final = (JobState.COMPLETED,)


def in_window(record: JobRecord, job: NewJob, now: float) -> bool:
    """Whether ``record`` holds ``job``'s key by its window: the same key, created less than
    ``job.unique_for`` seconds before ``now``, live or in one of ``job.unique_states``. The SQL
    drivers say the same (sqlite: insert_jobs; postgres/_jobs.sql: window_holders)."""
    return (
        job.unique_for is not None
        and record.key == job.key
        and record.created_at > now - job.unique_for
        and (record.state in LIVE_STATES or record.state.value in job.unique_states)
    )


WAITING_STATES_SQL: Final = sql_list(WAITING_STATES)

# How many fires of each task the fire record keeps: enough to refuse a second fire of any
# recent scheduled time; older ones are behind the task's mark, which refuses them anyway.
FIRE_HISTORY: Final = 100

# Said by the worker that claims a lapsed job, which cannot know why the other stopped: each
# cause that is not a crash has its own line in that worker's log (issue 32: a blocked loop
# was reported as "crash or kill", which neither had happened).
LAPSED_ERROR: Final = (
    "lease lapsed: no renewal from the worker running this attempt reached the database in"
    " time (it crashed or was killed, lost the database for longer than the lease, or was"
    " paused; its log says which: jobs.lease.expired, jobs.worker.loop-wedged,"
    " jobs.worker.process-stalled)"
)

# A worker's death charges nobody it cannot blame (docs/model.md, "A worker's death"): a claim
# that finds a lapsed lease hands the job back ORPHANED, its attempt uncounted and its orphans
# counted one more. From SUSPECT_AT orphanings on the job is a suspect, claimed only by a worker
# that runs nothing else (claim(alone=True)) and nothing is claimed beside it; a suspect whose
# worker dies while it runs alone is dead-lettered (X_KILLED_WORKER); and any job orphaned
# ORPHAN_LIMIT times is dead-lettered (X_ORPHANED), alone or not: the bound that keeps a job
# from taking workers down for ever where alone cannot be had (an older release's workers claim
# it beside others; whole machines die with it). SUSPECT_AT is 2, not 1: a job that was merely
# running beside a killer, or on a worker a deploy SIGKILLed, is orphaned once and runs on as
# any job; only one that was there twice waits for a worker of its own.
# The numbers live with the record (records.SUSPECT_AT, ORPHAN_LIMIT): `jobs-trio show` says them.


def is_suspect(orphans: int) -> bool:
    """Whether a job orphaned ``orphans`` times is claimed only alone."""
    return orphans >= SUSPECT_AT


# `{orphans}` stands for the job's count of orphanings with this one (the SQL drivers fill it in
# SQL, the memory driver here).
ORPHANED_ERROR: Final = (
    LAPSED_ERROR + "; handed back as orphaned ({orphans} of " + str(ORPHAN_LIMIT) + "), its"
    " attempt not counted"
)
KILLED_WORKER_ERROR: Final = str(
    KilledWorker(
        "its worker died while it ran alone (it had been orphaned twice before, so it ran with"
        " nothing beside it): most likely it kills the process that runs it (a crash in native"
        " code, memory exhausted, os._exit or a signal of its own); a worker SIGKILLed by a"
        " deploy, one that abandoned it at its drain's grace and could not say so"
        " (jobs.worker.alone-unmark-failed) or one paused past the lease reads the same",
        fix="look up how its worker (the history's last attempt) ended: a deploy's kill or"
        " jobs.worker.alone-unmark-failed means the job did not kill it (drain with a grace"
        " longer than the job, or call ctx.check_cancelled() in it), so `jobs-trio retry ID`;"
        " else find what kills the process in its body (the worker's exit status, the kernel's"
        " OOM log), fix it, then `jobs-trio retry ID`; no other job was charged",
    )
)
ORPHANED_TOO_OFTEN_ERROR: Final = str(
    OrphanedTooOften(
        f"its worker died under it {ORPHAN_LIMIT} times (leases lapsed; never while it ran alone)",
        fix="find why its workers die (exit statuses, the OOM log, a deploy that SIGKILLs"
        " instead of draining), then `jobs-trio retry ID`",
    )
)


@attrs.frozen
class Orphaning:
    """What a claim does with a lapsed job it finds (``orphaning``)."""

    state: JobState  # READY (handed back, uncounted) or DEAD (by the rule)
    orphans: int  # its orphanings with this one
    error: str  # its last_error
    hands_back: bool  # its attempt goes back (not when it is dead-lettered: it is to blame)


def orphaning(orphans: int, alone: bool, cancel_requested: bool = False) -> Orphaning:
    """The rule, for a lapsed job orphaned ``orphans`` times before that ran ``alone``. One
    an operator asked to cancel ends cancelled instead of going back (its run has ended, as a
    settlement's would: operator_transitions.cancel_instead). The PostgreSQL claim says the
    same in SQL (postgres_queries.sql, `handed_back`)."""
    now = orphans + 1
    if alone:
        return Orphaning(JobState.DEAD, now, KILLED_WORKER_ERROR, hands_back=False)
    if now >= ORPHAN_LIMIT:
        return Orphaning(JobState.DEAD, now, ORPHANED_TOO_OFTEN_ERROR, hands_back=False)
    if cancel_requested:
        return Orphaning(JobState.CANCELLED, now, OPERATOR_CANCEL_ERROR, hands_back=True)
    return Orphaning(JobState.READY, now, ORPHANED_ERROR.format(orphans=now), hands_back=True)


def orphaned_record(record: JobRecord, rule: Orphaning, seq: int, now: float) -> AttemptRecord:
    """The history record of a lapsed ``record``'s attempt, ended by its worker's death: the
    attempt and worker the job's row still names, no run time (nobody saw it end)."""
    outcome = OutcomeKind.DEAD_LETTERED if rule.state is JobState.DEAD else OutcomeKind.ORPHANED
    return AttemptRecord(
        seq=seq,
        attempt=record.attempts,
        outcome=outcome.value,
        worker_id=record.worker_id,
        ended_at=now,
        error=rule.error,
    )


def log_orphaned(
    job_id: str, name: str, worker_id: str | None, attempt: int, rule: Orphaning
) -> None:
    """``jobs.attempt.orphaned``, logged by the claim that hands a lapsed job back: WARNING for
    an orphaning, ERROR for a death by the rule (the worker that died logged nothing)."""
    dead = rule.state is JobState.DEAD
    log_event(
        "jobs.attempt.orphaned",
        logging.ERROR if dead else logging.WARNING,
        job_id=job_id,
        job=name,
        worker=worker_id,
        attempt=attempt,
        orphans=rule.orphans,
        then=rule.state.value,
        # The error only for a death by the rule: an orphaning's says nothing the line does not.
        **({"error": rule.error} if dead else {}),
    )


def key_matches(wanted: str | None, key: str | None) -> bool:
    """Whether an event of ``key`` is one a wait for ``wanted`` takes (None: any key). The SQL
    drivers say the same where they match events to waits."""
    return wanted is None or wanted == key


def send_wakes(record: JobRecord, name: str, key: str | None) -> bool:
    """Whether a send of event ``name`` with ``key`` wakes ``record``: suspended on the name,
    waiting for that key or for any. A wait for another key sleeps on: each send of a name woke
    every waiter of it, a fleet of workflows keyed by order id for each order's event. The SQL
    drivers say the same in their send_event."""
    return (
        record.state is JobState.SUSPENDED
        and record.wait_event == name
        and key_matches(record.wait_key, key)
    )


def hands_back_lapse(ahead: bool, ahead_lapses: int, max_attempts: int) -> bool:
    """Whether a lapsed job's attempt is handed back when it is claimed again: it was claimed
    ahead of a slot and its start never recorded (it most likely never ran: its worker died
    holding it), and fewer than ``max_attempts`` such lapses were handed back before. The bound
    is for the job that DID start and killed its worker before a renewal recorded the start:
    it still runs out of attempts, after at most twice its ``max_attempts`` runs. The
    PostgreSQL claim says the same in SQL (postgres/_jobs.sql, `claim`)."""
    return ahead and ahead_lapses < max_attempts


# What a settlement does to its job: the one table every driver applies (the memory driver on
# its records, SQLite as an UPDATE built from it, PostgreSQL as one statement per kind named
# here, fed the hand-back column from it). An operator's pending cancel changes a settlement
# before this applies (operator_transitions.cancel_instead).


@attrs.frozen
class Unseen:
    """The events a suspension's look could not see: those named ``event`` (with ``key``, when
    the wait matches one) past ``mark``, the look's EventLook.seen as its driver made it (memory
    and SQLite: the newest event id it read; PostgreSQL: its snapshot)."""

    event: str
    mark: str
    key: str | None = None

    def covers(self, name: str, key: str | None, event_id: int) -> bool:
        """For a mark of ids (memory, SQLite): whether event ``event_id`` is past it."""
        return name == self.event and event_id > int(self.mark) and key_matches(self.key, key)


@attrs.frozen
class Effect:
    state: JobState
    # The attempt its claim counted goes back: waiting (suspend), deploy skew (park) and an
    # interrupted run (a retry not counted) are not failures.
    hands_back: bool = False
    delay: float | None = None  # run again this many seconds from now; None: run_at stays
    writes: Mapping[str, str | None] = attrs.field(factory=dict)  # other record fields set
    # A suspension after a look: when one of these events is stored at the settle, the effect
    # is `woken(...)` instead.
    unseen: Unseen | None = None


@attrs.frozen
class SettlementKind:
    name: str  # PostgreSQL's statement for it is settle_<name>
    effect: Callable[[Any], Effect]
    moves_run_at: bool = False  # its statement takes a delay column (None: run_at stays)
    # Its statement takes a column of look marks (None: no look; Unseen.mark otherwise).
    reads_events: bool = False


# A look's mark when it saw no event of the name: every event id is past it (ids start at 1).
NO_EVENT_SEEN: Final = "0"


def event_mark(newest_id: int | None) -> str:
    """EventLook.seen for a look whose newest event of the name had id ``newest_id`` (None:
    it saw none). Read in the same snapshot as the look: an event the look missed because it
    was stored after it has an id past the mark (see `woken` for PostgreSQL's exception)."""
    return NO_EVENT_SEEN if newest_id is None else str(newest_id)


def woken(change: Effect) -> Effect:
    """A suspension whose look missed a stored event of its name (Effect.unseen) settles as the
    send would have left it had it come just after the settle: ready now, its wait_event kept.

    Why: send_event wakes the jobs already suspended on the name, and a job between its look
    and its suspend is still running, so a send then wakes nothing; without this the job slept
    its whole event_poll with its event stored. Only an event the wait's key matches wakes it;
    one its next look still does not take (sent before the wait began, by the clocks) costs
    that one look, and the next look's mark covers it: it never wakes the job again.

    Exact on every driver, whatever the order of the send and the suspend, in or out of an
    application's transaction. Memory and SQLite: one writer at a time, so ids are given in
    commit order and a send either committed before the settle (its id is past the mark) or
    commits after it (and finds the job suspended). PostgreSQL, where neither holds: the mark
    is the look's snapshot (an event is unseen when its transaction was not visible to the
    look), and a send wakes its waiters when it COMMITS (a deferred trigger), under a lock of
    the event's name and key that the settle's check also takes (try-locks: a send committing
    at that moment makes the job ready, never waits; docs/steps.md)."""
    return attrs.evolve(change, state=JobState.READY, delay=0.0, unseen=None)


def _suspend_effect(s: Suspend) -> Effect:
    unseen = None
    if s.event is not None and s.seen is not None:
        unseen = Unseen(s.event, s.seen, s.match)
    return Effect(
        JobState.SUSPENDED,
        hands_back=True,
        delay=s.delay,
        writes={"wait_event": s.event, "wait_key": s.match},
        unseen=unseen,
    )


def _retry_effect(s: Retry) -> Effect:
    # An attempt handed back at once (interrupted: a drain, a late claim, a hold limit) keeps
    # its run_at, so its place in line: it was running, so it was first. Given a new run_at of
    # now, it went behind every job that waited meanwhile (a deploy put the jobs it drained at
    # the back of a deep queue).
    keeps_place = s.hands_back and s.delay <= 0
    return Effect(
        JobState.READY,
        hands_back=s.hands_back,
        delay=None if keeps_place else s.delay,
        writes={"last_error": s.error},
    )


SETTLEMENT_KINDS: Final[Mapping[type, SettlementKind]] = {
    Complete: SettlementKind(
        "complete", lambda s: Effect(JobState.COMPLETED, writes={"result": s.result})
    ),
    Retry: SettlementKind("retry", _retry_effect, moves_run_at=True),
    DeadLetter: SettlementKind(
        "dead", lambda s: Effect(JobState.DEAD, writes={"last_error": s.error})
    ),
    Suspend: SettlementKind("suspend", _suspend_effect, moves_run_at=True, reads_events=True),
    Park: SettlementKind(
        "park", lambda s: Effect(JobState.PARKED, hands_back=True, writes={"last_error": s.reason})
    ),
    CancelJob: SettlementKind(
        "cancel", lambda s: Effect(JobState.CANCELLED, writes={"last_error": s.error})
    ),
}


# A job's attempt history keeps its newest this many endings (a ring: the ending numbered `seq`
# takes slot `seq % ATTEMPT_HISTORY`), so a job that sleeps in a loop or is drained at every
# deploy never grows it past this; its error and traceback are capped where they are made.
ATTEMPT_HISTORY: Final = 20

# A worker's presence record outlives its last announcement by this long (seconds), then the
# next announcement of any worker deletes it: a fleet's crashed workers do not pile up.
FORGET_WORKERS_AFTER: Final = 3600.0


def encode_jobs(jobs: Iterable[tuple[str, str, int]]) -> str:
    """A worker's declared jobs (WorkerPresence.jobs) as its row stores them: JSON."""
    return json.dumps([list(job) for job in jobs])


def decode_jobs(text: str | None) -> tuple[tuple[str, str, int], ...]:
    """The stored declared jobs; none from a worker of a release before they were stored."""
    if text is None:
        return ()
    return tuple(
        (str(name), str(queue), int(attempts)) for name, queue, attempts in json.loads(text)
    )


def name_stats(
    rows: Iterable[tuple[str, str, int, int, float | None, float | None]],
) -> list[NameStats]:
    """``name_stats()``'s answer from rows of (job name, outcome, attempts, how many were timed,
    their seconds summed, the longest), by name."""
    by_name: dict[str, tuple[dict[str, int], int, float, float | None]] = {}
    for name, outcome, n, timed, seconds, longest in rows:
        outcomes, had_timed, had_seconds, had_longest = by_name.get(name, ({}, 0, 0.0, None))
        outcomes[outcome] = outcomes.get(outcome, 0) + n
        if longest is not None and (had_longest is None or longest > had_longest):
            had_longest = longest
        by_name[name] = (outcomes, had_timed + timed, had_seconds + (seconds or 0.0), had_longest)
    return [NameStats(name, *by_name[name]) for name in sorted(by_name)]


def history_outcome(settlement: Settlement) -> str:
    """What a history record calls an ending (OutcomeKind's values); an operator's pending
    cancel, which the SQL drivers decide in SQL, makes any of them ``cancelled`` instead."""
    match settlement:
        case Complete():
            return "completed"
        case Retry(hands_back=True):
            return "interrupted"
        case Retry():
            return "retried"
        case DeadLetter():
            return "dead-lettered"
        case Suspend():
            return "suspended"
        case Park():
            return "parked"
        case CancelJob():
            return "cancelled"
    raise TypeError(f"not a settlement: {settlement!r}")


def history_record(applied: Settlement, change: Effect, seq: int, now: float) -> AttemptRecord:
    """The history record of ``applied`` (with a note), as written: ``change`` is the effect
    the driver applied (a cancel instead, a woken suspension), ``seq`` the job's count of
    endings with this one."""
    note = applied.note
    assert note is not None
    return AttemptRecord(
        seq=seq,
        attempt=note.attempt,
        outcome=history_outcome(applied),
        worker_id=note.worker_id,
        ended_at=now,
        seconds=note.seconds,
        error=change.writes.get("last_error"),
        traceback=note.traceback,
    )


def kind_of(settlement: Settlement) -> SettlementKind:
    try:
        return SETTLEMENT_KINDS[type(settlement)]
    except KeyError:
        raise TypeError(f"not a settlement: {settlement!r}") from None


def effect(settlement: Settlement) -> Effect:
    return kind_of(settlement).effect(settlement)


def queue_stats(
    depths: Iterable[tuple[str, str, int]],
    due: Iterable[tuple[str, int, float | None]],
    now: float,
    waiting: Iterable[tuple[str, str, str, int]] = (),
    paused: Iterable[str] = (),
) -> list[QueueStats]:
    """``stats()``'s answer, by queue name: ``depths`` counts jobs per (queue, state value),
    ``due`` gives a queue's count of ready jobs whose run-at has come and the earliest such
    run-at (a queue it leaves out has none due), ``waiting`` counts the jobs a claim put off
    for a fleet limit per (queue, job name, "slot" or "rate"), ``paused`` names the paused
    queues (listed whether or not they hold a job)."""
    by_queue: dict[str, dict[str, int]] = {}
    for queue, state, count in depths:
        by_queue.setdefault(queue, {})[state] = count
    paused = set(paused)
    for queue in paused:
        by_queue.setdefault(queue, {})
    due_by_queue = {queue: (count, oldest) for queue, count, oldest in due}
    waiting_by_queue: dict[str, list[tuple[str, str, int]]] = {}
    for queue, name, kind, count in waiting:
        waiting_by_queue.setdefault(queue, []).append((name, kind, count))
    answers = []
    for queue in sorted(by_queue):
        count, oldest = due_by_queue.get(queue, (0, None))
        answers.append(
            QueueStats(
                queue=queue,
                depth=by_queue[queue],
                due=count,
                oldest_ready_age=None if oldest is None else now - oldest,
                dead=by_queue[queue].get(JobState.DEAD.value, 0),
                limit_waiting=tuple(sorted(waiting_by_queue.get(queue, ()))),
                paused=queue in paused,
            )
        )
    return answers


# A relay's ticket (relay_ticket) is forgotten this many of its leases after it was recorded,
# with a floor: a relay uses a ticket for a take within one lease of getting it (relay.py), and
# writes within one lease of the take or has lost the rows anyway, so a ticket this old belongs
# to a relay that died idle or was fenced long ago. Forgetting one early only fences its write.
STALE_TICKET_LEASES: Final = 4
STALE_TICKET_FLOOR: Final = 60.0


def ticket_stale_at(now: float, lease: float) -> float:
    """When a ticket recorded at ``now`` for a relay of ``lease`` seconds is forgotten."""
    return now + max(STALE_TICKET_LEASES * lease, STALE_TICKET_FLOOR)


# Refusals every driver words the same way.


def driver_closed(driver: str) -> ConfigError:
    """For a call on a driver after its ``aclose()`` (``driver``: "memory", "SQLite", ...)."""
    return ConfigError(f"the {driver} driver is closed", fix="open a new driver")


def refuse_connection(connection: object | None, *, driver: str, fix: str) -> None:
    """Refuse ``connection=`` on a driver that cannot write in the caller's transaction.
    Refused rather than ignored: a caller who passes its transaction believes the write commits
    or rolls back with it, and here it could do neither. ``fix`` says what to do instead."""
    if connection is not None:
        raise ConfigError(f"the {driver} driver cannot enlist in a caller's transaction", fix=fix)


def refuse_in_place(driver: str) -> ConfigError:
    """``relay_in_place`` asked of an outbox this driver does not share (``shares_outbox``
    answered False): moving rows in one transaction needs them in this database."""
    return ConfigError(
        f"the {driver} driver's relay_in_place was given an outbox in another database",
        fix="ask shares_outbox(outbox) first; a relay does, and moves the rows of an outbox"
        " elsewhere in two steps (relay_enqueue, then outbox_delete)",
    )


def relay_fenced(ticket: str, rows: int) -> RelayFenced:
    """relay_enqueue under a ticket the job store no longer holds (revoked or stale)."""
    return RelayFenced(
        f"the relay's write of {rows} outbox row(s) was refused: its ticket {ticket} was"
        " revoked (another relay took its rows over once its lease lapsed: it was paused, or"
        " slower than its lease) or forgotten as stale",
        fix="nothing to do: the rows are the other relay's now and each is decided once; give"
        " the relay a longer lease (--lease) if its passes outlive it",
    )
