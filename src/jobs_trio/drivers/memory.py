# The memory driver: the whole contract on dicts, for tests and examples (nothing survives exit).
# Apart because it is the reference the SQLite and PostgreSQL drivers are checked against.
from __future__ import annotations

import collections
import itertools
import json
import math
import time
from collections.abc import Callable, Mapping, Sequence

import attrs
import trio

from .._core.errors import ValueRefused
from .._core.operator_transitions import (
    OPERATOR_CANCEL_ERROR,
    cancel_flags_only,
    cancel_instead,
    check_delete,
    check_retry,
    check_run_now,
    found,
    key_held,
)
from .._core.records import (
    WAITING_STATES,
    AttemptRecord,
    Claim,
    ClaimToken,
    Enqueued,
    EventLook,
    EventRecord,
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
    RelayHold,
    RelayOutcome,
    RenewResult,
    Settlement,
    StepRecord,
    TaskAdvance,
    TaskMark,
    WorkerPresence,
    new_token,
)
from ._claim_slots import ClaimSlots
from ._limit_rules import SLOT, LimitRow, decide, needs
from ._retention import DEAD_STATE, FINISHED_STATES, cutoffs, turn_is_free
from ._rules import (
    ATTEMPT_HISTORY,
    FIRE_HISTORY,
    FORGET_WORKERS_AFTER,
    LAPSED_ERROR,
    LIVE_STATES,
    Unseen,
    driver_closed,
    effect,
    event_mark,
    hands_back_lapse,
    history_record,
    in_window,
    key_matches,
    lapsed_out_of_attempts,
    limit_fields,
    name_stats,
    queue_stats,
    refuse_connection,
    refuse_in_place,
    relay_fenced,
    send_wakes,
    stored_value,
    ticket_stale_at,
    woken,
)
from ._transaction import unwrap
from .contract import BesideConnection, Capabilities, Driver


def _refuse_unstorable(settlement: Settlement) -> None:
    for value in attrs.astuple(settlement, recurse=False):
        if not isinstance(value, str):
            continue
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueRefused(
                f"memory driver refused a {type(settlement).__name__}: {exc}",
                fix="store text without lone surrogates",
            ) from exc
        if "\x00" in value:
            raise ValueRefused(
                f"memory driver refused a {type(settlement).__name__}: text with a NUL character",
                fix="store text without NUL characters (PostgreSQL refuses them too)",
            )


@attrs.frozen
class _OutboxRow:
    job: NewJob
    run_at: float
    created_at: float
    claimed_until: float | None = None
    relay_id: str | None = None
    ticket: str | None = None  # the ticket of the relay holding it (relay_ticket)
    superseded: tuple[str, ...] = ()  # the tickets of every relay that held it before


class MemoryDriver:
    """Jobs in a dict. ``clock`` defaults to the wall clock; tests on Trio's ``MockClock`` pass
    ``trio.current_time`` so leases and delays move with the mock time."""

    # Every capability of the contract (Capabilities): the conformance suite tests each.
    capabilities = Capabilities(
        settles_with_claims=True,
        claims_ahead=True,
        rescue_on_request=True,
        renews_beside=True,
        hands_back_unheld=True,
        claims_side_by_side=True,
    )

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

    def _wake(self) -> None:
        self._lot.unpark_all()

    def _put(self, record: JobRecord, **changes: object) -> JobRecord:
        updated = attrs.evolve(record, updated_at=self.now(), **changes)  # type: ignore[arg-type]
        self._jobs[record.id] = updated
        return updated

    async def enqueue(
        self, jobs: Sequence[NewJob], *, connection: object | None = None
    ) -> Sequence[Enqueued]:
        await trio.lowlevel.checkpoint()
        self._check_open()
        refuse_connection(
            connection,
            driver="memory",
            fix="enqueue without connection=, or use the SQLite or PostgreSQL driver",
        )
        answers = self._insert(jobs, self.now())
        self._wake()
        return answers

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

    def _claimable(
        self, queues: Sequence[str], now: float, *, rescue: bool = True
    ) -> list[JobRecord]:
        wanted = set(queues)
        due = [
            r
            for r in self._jobs.values()
            if r.queue in wanted
            and (
                (r.state in WAITING_STATES and r.run_at <= now)
                or (
                    rescue
                    and r.state is JobState.RUNNING
                    and r.lease_until is not None
                    and r.lease_until <= now
                )
            )
        ]
        due.sort(key=lambda r: (r.priority, r.run_at, r.id))
        return due

    def _hands_back(self, record: JobRecord) -> bool:
        """A lapsed job claimed again with its attempt handed back (rules.hands_back_lapse)."""
        return record.state is JobState.RUNNING and hands_back_lapse(
            record.id in self._ahead, self._ahead_lapses[record.id], record.max_attempts
        )

    def _out_of_attempts(self, record: JobRecord) -> bool:
        """A lapsed job whose attempts are used up: dead-lettered by a claim, never run again."""
        return (
            record.state is JobState.RUNNING
            and record.attempts >= record.max_attempts
            and not self._hands_back(record)
        )

    async def claim(
        self,
        queues: Sequence[str],
        limit: int | Mapping[str, int],
        *,
        lease: float,
        worker_id: str,
        free: Mapping[str, int] | None = None,
        rescue: bool = True,
    ) -> Sequence[Claim]:
        await trio.lowlevel.checkpoint()
        self._check_open()
        now = self.now()
        # A paused queue is not asked at all: nothing of it is claimed, lapsed or not.
        slots = ClaimSlots.of([q for q in queues if q not in self._pauses], limit)
        claimable = self._claimable(list(slots.caps), now, rescue=rescue)
        # Attempts are counted at claim, so a job that keeps killing its worker ends here
        # instead of looping forever. Up to `limit` of them per claim, apart from the `limit`
        # taken: bounded work, and the rest stay lapsed (due at once) for the next claim.
        exhausted = [r for r in claimable if self._out_of_attempts(r)]
        for record in exhausted[: slots.total]:
            self._dead_from_lapse(record)
        claims: list[Claim] = []
        picked = slots.take((r.queue, r) for r in claimable if not self._out_of_attempts(r))
        ahead = {r.id for r in slots.ahead(((r.queue, r) for r in picked), free) if not r.limits}
        granted = self._apply_limits(picked, now, lease)
        for record in picked:
            if record.limits is not None and record.id not in granted:
                continue
            token = granted.get(record.id) or new_token()
            last_error = record.last_error
            if record.state is JobState.RUNNING:
                last_error = LAPSED_ERROR
            handed_back = self._hands_back(record)
            self._ahead_lapses[record.id] += handed_back
            if record.id in ahead:
                self._ahead.add(record.id)
            else:
                self._ahead.discard(record.id)
            updated = self._put(
                record,
                state=JobState.RUNNING,
                attempts=record.attempts + (0 if handed_back else 1),
                lease_until=now + lease,
                worker_id=worker_id,
                last_error=last_error,
                wait_event=None,
                wait_key=None,
                waiting_on=None,
            )
            self._tokens[record.id] = token
            claims.append(
                Claim(
                    job_id=record.id,
                    token=token,
                    name=record.name,
                    queue=record.queue,
                    payload=record.payload,
                    attempt=updated.attempts,
                    max_attempts=record.max_attempts,
                    lease_until=now + lease,
                    context=record.context,
                    ahead=record.id in ahead,
                    due_at=record.run_at,
                )
            )
        return claims

    def _apply_limits(
        self, picked: Sequence[JobRecord], now: float, lease: float
    ) -> Mapping[JobId, ClaimToken]:
        """Decide the limited jobs among ``picked``: take their rows, put off the blocked ones
        (a lapsed one goes back to ready, its lapse recorded); answer the granted tokens."""
        limited = [(r.id, r.limits) for r in picked if r.limits is not None]
        if not limited:
            return {}
        keys = {(kind, key) for _, limits in limited for kind, key, _ in needs(limits)}
        rows = {k: list(self._limit_rows.get(k, {}).values()) for k in keys}
        decision = decide(limited, rows, now=now, lease=lease, missing_is_free=True)
        for row in decision.taken:
            self._limit_rows.setdefault((row.kind, row.key), {})[row.n] = row
        for job_id, (run_at, waits) in decision.put_off.items():
            record = self._jobs[job_id]
            if record.state is JobState.RUNNING:
                self._tokens.pop(job_id, None)
                record = self._put(
                    record,
                    state=JobState.READY,
                    lease_until=None,
                    worker_id=None,
                    last_error=LAPSED_ERROR,
                )
            self._put(record, run_at=run_at, waiting_on=waits)
        return decision.granted

    def _held_slot(self, job_id: JobId, token: ClaimToken) -> LimitRow | None:
        limits = self._jobs[job_id].limits
        if limits is None or limits.slot_key is None:
            return None
        for row in self._limit_rows.get((SLOT, limits.slot_key), {}).values():
            if row.token == token:
                return row
        return None

    def _release_slot(self, job_id: JobId, token: ClaimToken, now: float) -> None:
        """A settled run's slot is free at once, and the first job waiting on it is due now."""
        row = self._held_slot(job_id, token)
        if row is None:
            return
        self._limit_rows[(SLOT, row.key)][row.n] = LimitRow(SLOT, row.key, row.n)
        waits = f"{SLOT}:{row.key}"
        waiting = [
            r
            for r in self._jobs.values()
            if r.waiting_on == waits
            and r.state in WAITING_STATES
            and r.run_at > now  # one woken already is due: wake the next
        ]
        if waiting:
            first = min(waiting, key=lambda r: (r.priority, r.run_at, r.id))
            self._put(first, run_at=now)

    def _dead_from_lapse(self, record: JobRecord) -> None:
        self._tokens.pop(record.id, None)
        self._put(
            record,
            state=JobState.DEAD,
            lease_until=None,
            worker_id=None,
            last_error=lapsed_out_of_attempts(record.attempts),
        )

    def _current(self, lease: Lease) -> JobRecord | None:
        record = self._jobs.get(lease.job_id)
        if record is None or record.state is not JobState.RUNNING:
            return None
        if self._tokens.get(lease.job_id) != lease.token:
            return None
        return record

    async def renew(
        self, leases: Sequence[Lease], *, lease: float, started: Sequence[ClaimToken] = ()
    ) -> RenewResult:
        await trio.lowlevel.checkpoint()
        self._check_open()
        return self._renew(leases, lease, started)

    def beside(self) -> BesideConnection:
        return _MemoryBeside(self)

    async def hand_back_unheld(
        self, worker_id: str, queues: Sequence[str], held: Sequence[ClaimToken]
    ) -> Sequence[JobId]:
        await trio.lowlevel.checkpoint()
        self._check_open()
        now, kept, wanted = self.now(), set(held), set(queues)
        unheld = [
            r
            for r in self._jobs.values()
            if r.state is JobState.RUNNING
            and r.worker_id == worker_id
            and r.queue in wanted
            and self._tokens.get(r.id) not in kept
        ]
        for record in unheld:
            self._ahead.add(record.id)
            self._put(record, lease_until=now)
        return [r.id for r in unheld]

    def _renew(
        self, leases: Sequence[Lease], lease: float, started: Sequence[ClaimToken]
    ) -> RenewResult:
        now = self.now()
        held: set[ClaimToken] = set()
        cancel: set[ClaimToken] = set()
        lost: set[ClaimToken] = set()
        for one in leases:
            record = self._current(one)
            if record is None:
                continue
            self._put(record, lease_until=now + lease)
            held.add(one.token)
            if one.token in started:
                self._ahead.discard(one.job_id)
            if record.cancel_requested:
                cancel.add(one.token)
            if record.slot_key is not None:
                slot = self._held_slot(one.job_id, one.token)
                if slot is None:
                    lost.add(one.token)
                else:
                    self._limit_rows[(SLOT, slot.key)][slot.n] = attrs.evolve(
                        slot, until=now + lease
                    )
        return RenewResult(
            held=frozenset(held), cancel_requested=frozenset(cancel), slot_lost=frozenset(lost)
        )

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
    ) -> tuple[Sequence[JobId], Sequence[Claim]]:
        # In order, through the methods a test double overrides (a stalled or refusing settle
        # holds or fails the claim with it, as one write would). settle refuses before it
        # applies anything and this claim cannot fail after it, so it is one write here.
        applied = await self.settle(settlements)
        claims = await self.claim(
            queues, limit, lease=lease, worker_id=worker_id, free=free, rescue=rescue
        )
        return applied, claims

    async def settle(self, settlements: Sequence[Settlement]) -> Sequence[JobId]:
        await trio.lowlevel.checkpoint()
        self._check_open()
        applied = self._settle(settlements)
        self._wake()  # Trio's side only: _MemoryBeside settles from a thread, and wakes nothing
        return applied

    def _settle(self, settlements: Sequence[Settlement]) -> list[JobId]:
        now = self.now()
        # Refused as PostgreSQL and SQLite refuse it, before anything applies: on every driver
        # a batch is all or nothing, which is what lets the settler split a refused one.
        for s in settlements:
            _refuse_unstorable(s)
        applied: list[JobId] = []
        for s in settlements:
            record = self._current(s.lease)
            if record is None:
                continue
            if record.cancel_requested:
                s = cancel_instead(s) or s
            self._tokens.pop(record.id, None)
            self._release_slot(record.id, s.lease.token, now)
            change = effect(s)
            if change.unseen is not None and self._stored_past(change.unseen):
                change = woken(change)
            writes = dict(change.writes)
            if "result" in writes:  # a record holds the value, as the SQL drivers read it back
                writes["result"] = stored_value(writes["result"])
            self._put(
                record,
                state=change.state,
                attempts=record.attempts - change.hands_back,
                run_at=record.run_at if change.delay is None else now + max(change.delay, 0.0),
                lease_until=None,
                worker_id=None,
                cancel_requested=False,
                **writes,
            )
            self._attempt_seq[record.id] += 1  # every ending counts, recorded or not
            if s.note is not None:
                history = self._attempts.setdefault(
                    record.id, collections.deque(maxlen=ATTEMPT_HISTORY)
                )
                history.append(history_record(s, change, self._attempt_seq[record.id], now))
            applied.append(record.id)
        return applied

    async def get(self, job_id: JobId) -> JobRecord | None:
        await trio.lowlevel.checkpoint()
        self._check_open()
        return self._jobs.get(job_id)

    async def list_jobs(
        self,
        *,
        state: JobState | None = None,
        queue: str | None = None,
        name: str | None = None,
        changed_before: float | None = None,
        limit: int = 100,
    ) -> Sequence[JobRecord]:
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

    async def pause_queue(self, queue: str, *, by: str | None = None) -> QueuePause:
        await trio.lowlevel.checkpoint()
        self._check_open()
        if queue not in self._pauses:
            self._pause_epoch += 1
            self._pauses[queue] = QueuePause(queue, self.now(), by, self._pause_epoch)
            self._pause_lot.unpark_all()
        return self._pauses[queue]

    async def resume_queue(self, queue: str) -> bool:
        await trio.lowlevel.checkpoint()
        self._check_open()
        if self._pauses.pop(queue, None) is None:
            return False
        self._pause_epoch += 1
        self._pause_lot.unpark_all()
        self._wake()
        return True

    async def queue_pauses(self) -> Sequence[QueuePause]:
        await trio.lowlevel.checkpoint()
        self._check_open()
        return self._paused_now()

    def _paused_now(self) -> list[QueuePause]:
        return [self._pauses[queue] for queue in sorted(self._pauses)]

    async def wait_for_pauses(self, seen: int | None, timeout: float) -> PauseLook:
        await trio.lowlevel.checkpoint()
        self._check_open()
        if seen == self._pause_epoch:
            with trio.move_on_after(timeout):
                await self._pause_lot.park()
            self._check_open()
        return PauseLook(self._pause_epoch, tuple(self._paused_now()))

    async def pauses_heard(self, worker_id: str, epoch: int) -> None:
        await trio.lowlevel.checkpoint()
        self._check_open()
        now = self.now()
        self._pauses_heard[worker_id] = (epoch, now)
        forget_before = now - FORGET_WORKERS_AFTER
        for gone in [w for w, (_, at) in self._pauses_heard.items() if at < forget_before]:
            del self._pauses_heard[gone]

    async def pause_holders(self, queue: str) -> Sequence[PauseHolder]:
        await trio.lowlevel.checkpoint()
        self._check_open()
        held: dict[str, list[float]] = {}
        for r in self._jobs.values():
            if r.queue == queue and r.state is JobState.RUNNING and r.worker_id is not None:
                held.setdefault(r.worker_id, []).append(r.lease_until or 0.0)
        return [
            PauseHolder(
                worker_id,
                len(leases),
                max(leases),
                self._pauses_heard[worker_id][0] if worker_id in self._pauses_heard else None,
            )
            for worker_id, leases in sorted(held.items())
        ]

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

    def _next_due_in(self, queues: Sequence[str], rescue_from: float | None = None) -> float:
        now = self.now()
        lapses_from = -math.inf if rescue_from is None else rescue_from
        wanted = set(queues) - self._pauses.keys()  # a paused queue's jobs are no work
        soonest = float("inf")
        for r in self._jobs.values():
            if r.queue not in wanted:
                continue
            if r.state in WAITING_STATES:
                soonest = min(soonest, r.run_at - now)
            elif r.state is JobState.RUNNING and r.lease_until is not None:
                soonest = min(soonest, max(r.lease_until, lapses_from) - now)
        return soonest

    async def wait_for_work(
        self, queues: Sequence[str], timeout: float, *, rescue_from: float | None = None
    ) -> None:
        self._check_open()
        due_in = self._next_due_in(queues, rescue_from)
        if due_in <= 0:
            await trio.lowlevel.checkpoint()
            return
        with trio.move_on_after(min(timeout, due_in)):
            await self._lot.park()

    async def load_steps(self, job_id: JobId) -> Sequence[StepRecord]:
        await trio.lowlevel.checkpoint()
        self._check_open()
        return list(self._steps.get(job_id, {}).values())

    async def save_step(
        self, lease: Lease, step: StepRecord, *, connection: object | None = None
    ) -> bool:
        await trio.lowlevel.checkpoint()
        self._check_open()
        refuse_connection(
            connection,
            driver="memory",
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

    def _stored_past(self, unseen: Unseen) -> bool:
        return any(unseen.covers(e.name, e.key, int(e.id)) for e in self._events)

    async def task_marks(self) -> Sequence[TaskMark]:
        await trio.lowlevel.checkpoint()
        self._check_open()
        return [self._task_marks[name] for name in sorted(self._task_marks)]

    async def advance_task(self, advance: TaskAdvance) -> bool:
        await trio.lowlevel.checkpoint()
        self._check_open()
        mark = self._task_marks.get(advance.task)
        if (None if mark is None else mark.handled_until) != advance.expected:
            return False
        fired = self._task_fires.setdefault(advance.task, {})
        if any(f.scheduled in fired for f in advance.fires):
            return False
        now = self.now()
        answers = self._insert([f.job for f in advance.fires], now)
        for fire, answer in zip(advance.fires, answers, strict=True):
            fired[fire.scheduled] = answer.job_id
        for old in sorted(fired)[:-FIRE_HISTORY]:
            del fired[old]
        moved = mark or TaskMark(advance.task, advance.advance_to)
        if answers:
            moved = attrs.evolve(
                moved,
                last_fired=advance.fires[-1].scheduled,
                last_fired_at=now,
                last_job_id=answers[-1].job_id,
            )
        self._task_marks[advance.task] = attrs.evolve(moved, handled_until=advance.advance_to)
        self._wake()
        return True

    # The outbox.

    async def outbox_write(
        self, jobs: Sequence[NewJob], *, connection: object | None = None
    ) -> None:
        await trio.lowlevel.checkpoint()
        self._check_open()
        refuse_connection(
            unwrap(connection)[0],
            driver="memory",
            fix="write to the outbox outside jobs_trio.transaction(), or use SQLite or"
            " PostgreSQL for the application's database",
        )
        now = self.now()
        for job in jobs:
            self._outbox[job.job_id] = _OutboxRow(job, now + max(job.delay, 0.0), now)

    async def outbox_claim(
        self, limit: int, *, lease: float, relay_id: str, ticket: str
    ) -> OutboxBatch:
        await trio.lowlevel.checkpoint()
        self._check_open()
        now = self.now()
        taken: list[NewJob] = []
        superseded: dict[str, None] = {}
        for job_id, row in self._outbox.items():
            if len(taken) >= limit:
                break
            if row.claimed_until is not None and row.claimed_until > now:
                continue
            before = row.superseded + ((row.ticket,) if row.ticket is not None else ())
            superseded.update(dict.fromkeys(before))
            self._outbox[job_id] = attrs.evolve(
                row, claimed_until=now + lease, relay_id=relay_id, ticket=ticket, superseded=before
            )
            taken.append(attrs.evolve(row.job, delay=max(row.run_at - now, 0.0)))
        return OutboxBatch(tuple(taken), ticket, tuple(superseded))

    async def outbox_delete(
        self, job_ids: Sequence[JobId], *, ticket: str | None = None
    ) -> Sequence[JobId]:
        await trio.lowlevel.checkpoint()
        self._check_open()
        gone = [
            job_id
            for job_id in dict.fromkeys(job_ids)
            if job_id in self._outbox and ticket in (None, self._outbox[job_id].ticket)
        ]
        for job_id in gone:
            del self._outbox[job_id]
        return gone

    async def outbox_stats(self) -> OutboxStats:
        await trio.lowlevel.checkpoint()
        self._check_open()
        oldest = min((row.created_at for row in self._outbox.values()), default=None)
        holds: dict[str, tuple[int, float]] = {}
        for row in self._outbox.values():
            if row.relay_id is not None and row.claimed_until is not None:
                rows, until = holds.get(row.relay_id, (0, -math.inf))
                holds[row.relay_id] = (rows + 1, max(until, row.claimed_until))
        return OutboxStats(
            pending=len(self._outbox),
            oldest_age=None if oldest is None else self.now() - oldest,
            held=tuple(RelayHold(r, n, until) for r, (n, until) in sorted(holds.items())),
        )

    async def outbox_present(self, job_ids: Sequence[JobId]) -> Sequence[JobId]:
        await trio.lowlevel.checkpoint()
        self._check_open()
        return [job_id for job_id in job_ids if job_id in self._outbox]

    async def outbox_source(self) -> str:
        await trio.lowlevel.checkpoint()
        self._check_open()
        return self._outbox_source

    # The relay's decisions.

    async def relay_ticket(self, source: str, *, relay_id: str, lease: float) -> str:
        await trio.lowlevel.checkpoint()
        self._check_open()
        now = self.now()
        for stale in [t for t, (_, stale_at) in self._tickets.items() if stale_at <= now]:
            del self._tickets[stale]
        ticket = new_token()
        self._tickets[ticket] = (source, ticket_stale_at(now, lease))
        return ticket

    async def relay_enqueue(
        self,
        jobs: Sequence[NewJob],
        *,
        source: str,
        ticket: str,
        superseded: Sequence[str] = (),
    ) -> Sequence[RelayDecision]:
        await trio.lowlevel.checkpoint()
        self._check_open()
        # No checkpoint between the fence, the look and the write: no other task runs between.
        for revoked in superseded:
            self._tickets.pop(revoked, None)
        if self._tickets.pop(ticket, None) is None:
            raise relay_fenced(ticket, len(jobs))
        return self._decide(jobs, self.now(), source)

    async def relay_forget(self, source: str, job_ids: Sequence[JobId]) -> int:
        await trio.lowlevel.checkpoint()
        self._check_open()
        gone = [i for i in job_ids if i in self._decisions and self._decisions[i][0] == source]
        for job_id in gone:
            del self._decisions[job_id]
        return len(gone)

    async def relay_decisions(self, source: str, *, before: float, limit: int) -> Sequence[JobId]:
        await trio.lowlevel.checkpoint()
        self._check_open()
        old = sorted(
            (decision.decided_at, job_id)
            for job_id, (of, decision) in self._decisions.items()
            if of == source and decision.decided_at < before
        )
        return [job_id for _, job_id in old[: max(limit, 0)]]

    async def shares_outbox(self, outbox: Driver) -> bool:
        await trio.lowlevel.checkpoint()
        return outbox is self

    async def relay_in_place(self, outbox: Driver, limit: int) -> Sequence[RelayDecision]:
        await trio.lowlevel.checkpoint()
        self._check_open()
        if outbox is not self:
            raise refuse_in_place("memory")
        now = self.now()
        taken = [
            job_id
            for job_id, row in self._outbox.items()
            if row.claimed_until is None or row.claimed_until <= now
        ][: max(limit, 0)]
        rows = [self._outbox.pop(job_id) for job_id in taken]
        jobs = [attrs.evolve(row.job, delay=max(row.run_at - now, 0.0)) for row in rows]
        for row in rows:  # a two-step relay that held one may wake from a pause: fenced
            for revoked in (*row.superseded, row.ticket):
                self._tickets.pop(revoked or "", None)
        decisions = self._decide(jobs, now, None)
        for job_id in taken:
            self._decisions.pop(job_id, None)  # the row is gone: nothing can take it again
        return decisions

    def _decide(
        self, jobs: Sequence[NewJob], now: float, source: str | None
    ) -> list[RelayDecision]:
        """Each row's decision: the one on record, else made now (and recorded, unless
        ``source`` is None: in place, the row goes with the job)."""
        on_record = {
            job.job_id: attrs.evolve(self._decisions[job.job_id][1], already=True)
            for job in jobs
            if job.job_id in self._decisions
        }
        # Relayed before decisions were recorded (a release before them): created, and done.
        on_record.update(
            (job.job_id, RelayDecision(job.job_id, RelayOutcome.CREATED, job.job_id, now, True))
            for job in jobs
            if job.job_id not in on_record and job.job_id in self._jobs
        )
        fresh = [job for job in jobs if job.job_id not in on_record]
        for job, answer in zip(fresh, self._insert(fresh, now), strict=True):
            decision = RelayDecision(
                job.job_id,
                RelayOutcome.CREATED if answer.created else RelayOutcome.KEY_HELD,
                answer.job_id,
                now,
            )
            on_record[job.job_id] = decision
            if source is not None:
                self._decisions[job.job_id] = (source, decision)
        if fresh:
            self._wake()
        return [on_record[job.job_id] for job in jobs]

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

    async def worker_seen(self, presence: WorkerPresence) -> None:
        await trio.lowlevel.checkpoint()
        self._check_open()
        self._workers[presence.worker_id] = presence
        forget_before = self.now() - FORGET_WORKERS_AFTER
        for gone in [w for w in self._workers.values() if w.seen_at < forget_before]:
            del self._workers[gone.worker_id]

    async def worker_gone(self, worker_id: str) -> None:
        await trio.lowlevel.checkpoint()
        self._check_open()
        self._workers.pop(worker_id, None)

    async def workers(self) -> Sequence[WorkerPresence]:
        await trio.lowlevel.checkpoint()
        self._check_open()
        return [self._workers[w] for w in sorted(self._workers)]

    async def aclose(self) -> None:
        self._closed = True
        self._wake()
        self._pause_lot.unpark_all()


class _MemoryBeside:
    """The memory driver seen from the lease lifeline's thread: its records, changed from there
    while the Trio thread is blocked (the one time the lifeline acts), which is when nothing
    else changes them."""

    def __init__(self, driver: MemoryDriver) -> None:
        self._driver = driver

    def renew(self, leases: Sequence[Lease], *, lease: float) -> frozenset[ClaimToken]:
        self._driver._check_open()
        return self._driver._renew(leases, lease, ()).held

    def settle(self, settlements: Sequence[Settlement]) -> Sequence[JobId]:
        self._driver._check_open()
        return self._driver._settle(settlements)

    def close(self) -> None:
        pass
