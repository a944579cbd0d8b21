# The memory driver's jobs: enqueue, claim (with fleet limits and claims ahead), renew, settle.
# Apart because it is the path every job takes; the other capabilities only read or nudge it.
from __future__ import annotations

import collections
import math
from collections.abc import Mapping, Sequence

import attrs
import trio

from ..._core.errors import ValueRefused
from ..._core.operator_transitions import (
    cancel_instead,
)
from ..._core.records import (
    WAITING_STATES,
    Claim,
    ClaimToken,
    Enqueued,
    JobId,
    JobRecord,
    JobState,
    Lease,
    NewJob,
    RenewResult,
    Settlement,
    new_token,
)
from .._calls import ClaimAsk, ClaimCalls
from .._claim_slots import ClaimSlots
from .._limit_rules import SLOT, LimitRow, decide, needs
from .._rows import stored_value
from .._rules import (
    ATTEMPT_HISTORY,
    LAPSED_ERROR,
    effect,
    hands_back_lapse,
    history_record,
    is_suspect,
    log_orphaned,
    orphaned_record,
    orphaning,
    woken,
)
from ..contract import BesideConnection
from ._store import MemoryStore


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


class _MemoryBeside:
    """The memory driver seen from the lease lifeline's thread: its records, changed from there
    while the Trio thread is blocked (the one time the lifeline acts), which is when nothing
    else changes them."""

    def __init__(self, driver: MemoryJobs) -> None:
        self._driver = driver

    def renew(self, leases: Sequence[Lease], *, lease: float) -> frozenset[ClaimToken]:
        self._driver._check_open()
        return self._driver._renew(leases, lease, ()).held

    def settle(self, settlements: Sequence[Settlement]) -> Sequence[JobId]:
        self._driver._check_open()
        return self._driver._settle(settlements)

    def close(self) -> None:
        pass


class MemoryJobs(ClaimCalls, MemoryStore):
    """Enqueue, claim, renew and settle: a job's way from written to ended."""

    async def enqueue(
        self, jobs: Sequence[NewJob], *, connection: object | None = None
    ) -> Sequence[Enqueued]:
        await self._write_alone(
            connection, fix="enqueue without connection=, or use the SQLite or PostgreSQL driver"
        )
        answers = self._insert(jobs, self.now())
        self._wake()
        return answers

    def _claimable(
        self, queues: Sequence[str], now: float, *, alone: bool = False
    ) -> list[JobRecord]:
        """The due jobs of ``queues`` in claim order. Suspects (rules.is_suspect) only for a
        claim ``alone``, and then the first of them only, with nothing beside it."""
        wanted = set(queues)
        due = [
            r
            for r in self._jobs.values()
            if r.queue in wanted and r.state in WAITING_STATES and r.run_at <= now
        ]
        due.sort(key=lambda r: (r.priority, r.run_at, r.id))
        suspects = [r for r in due if is_suspect(r.orphans)]
        if alone and suspects:
            return suspects[:1]
        return [r for r in due if not is_suspect(r.orphans)]

    def _lapsed(self, queues: Sequence[str], now: float) -> list[JobRecord]:
        wanted = set(queues)
        lapsed = [
            r
            for r in self._jobs.values()
            if r.queue in wanted
            and r.state is JobState.RUNNING
            and r.lease_until is not None
            and r.lease_until <= now
        ]
        lapsed.sort(key=lambda r: (r.priority, r.run_at, r.id))
        return lapsed

    def _release_lapsed(self, record: JobRecord, now: float) -> None:
        """A lapsed job handed back before the claim looks for candidates: never started (taken
        ahead, rules.hands_back_lapse) it goes back as it was; else it is orphaned
        (rules.orphaning): ready with its attempt uncounted, or dead by the rule. Either way at
        its place in line (run_at kept: it was running, so it was first)."""
        self._tokens.pop(record.id, None)
        alone = record.id in self._alone
        self._alone.discard(record.id)
        was_ahead = record.id in self._ahead
        self._ahead.discard(record.id)
        if hands_back_lapse(was_ahead, self._ahead_lapses[record.id], record.max_attempts):
            self._ahead_lapses[record.id] += 1
            self._put(
                record,
                state=JobState.READY,
                attempts=record.attempts - 1,
                last_error=LAPSED_ERROR,
                lease_until=None,
                worker_id=None,
            )
            return
        rule = orphaning(record.orphans, alone, record.cancel_requested)
        self._put(
            record,
            state=rule.state,
            attempts=record.attempts - rule.hands_back,
            orphans=rule.orphans,
            last_error=rule.error,
            lease_until=None,
            worker_id=None,
            # A cancel ended it; a dead job keeps the flag (retry clears it).
            cancel_requested=record.cancel_requested and rule.state is JobState.DEAD,
        )
        self._attempt_seq[record.id] += 1
        self._attempts.setdefault(record.id, collections.deque(maxlen=ATTEMPT_HISTORY)).append(
            orphaned_record(record, rule, self._attempt_seq[record.id], now)
        )
        log_orphaned(record.id, record.name, record.worker_id, record.attempts, rule)

    async def _claim(self, ask: ClaimAsk) -> Sequence[Claim]:
        queues, limit, lease, worker_id, free, rescue = ask.parts()
        alone = ask.alone
        await trio.lowlevel.checkpoint()
        self._check_open()
        now = self.now()
        # A paused queue is not asked at all: nothing of it is claimed, lapsed or not.
        slots = ClaimSlots.of([q for q in queues if q not in self._pauses], limit)
        if rescue:
            # Up to `limit` lapsed jobs handed back per claim, before it looks: bounded work,
            # and the rest stay lapsed (due at once) for the next claim. Those handed back
            # ready are candidates at their place in line, as any due job.
            for record in self._lapsed(list(slots.caps), now)[: slots.total]:
                self._release_lapsed(record, now)
        claimable = self._claimable(list(slots.caps), now, alone=alone)
        claims: list[Claim] = []
        picked = slots.take((r.queue, r) for r in claimable)
        ahead = {r.id for r in slots.ahead(((r.queue, r) for r in picked), free) if not r.limits}
        granted = self._apply_limits(picked, now, lease)
        for record in picked:
            if record.limits is not None and record.id not in granted:
                continue
            token = granted.get(record.id) or new_token()
            if record.id in ahead:
                self._ahead.add(record.id)
            else:
                self._ahead.discard(record.id)
            suspect = is_suspect(record.orphans)
            if suspect:
                self._alone.add(record.id)
            updated = self._put(
                record,
                state=JobState.RUNNING,
                attempts=record.attempts + 1,
                lease_until=now + lease,
                worker_id=worker_id,
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
                    alone=suspect,
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

    async def unmark_alone(self, leases: Sequence[Lease]) -> Sequence[JobId]:
        await trio.lowlevel.checkpoint()
        self._check_open()
        held = [one.job_id for one in leases if self._current(one) is not None]
        # Only the mark: the run keeps its lease, so nobody claims it until that lapses.
        self._alone.difference_update(held)
        return held

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

    async def _settle_and_claim(
        self, settlements: Sequence[Settlement], ask: ClaimAsk
    ) -> tuple[Sequence[JobId], Sequence[Claim]]:
        # In order, through the methods a test double overrides (a stalled or refusing settle
        # holds or fails the claim with it, as one write would). settle refuses before it
        # applies anything and this claim cannot fail after it, so it is one write here.
        applied = await self.settle(settlements)
        return applied, await self._ask_claim(ask)

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
            self._alone.discard(record.id)
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

    def _next_due_in(
        self, queues: Sequence[str], rescue_from: float | None = None, alone: bool = False
    ) -> float:
        now = self.now()
        lapses_from = -math.inf if rescue_from is None else rescue_from
        wanted = set(queues) - self._pauses.keys()  # a paused queue's jobs are no work
        soonest = float("inf")
        for r in self._jobs.values():
            if r.queue not in wanted:
                continue
            if r.state in WAITING_STATES:
                if is_suspect(r.orphans) and not alone:
                    continue  # no work for a worker that runs something (claim(alone=))
                soonest = min(soonest, r.run_at - now)
            elif r.state is JobState.RUNNING and r.lease_until is not None:
                soonest = min(soonest, max(r.lease_until, lapses_from) - now)
        return soonest

    async def _wait_for_work(
        self, queues: Sequence[str], timeout: float, rescue_from: float | None, alone: bool
    ) -> None:
        self._check_open()
        due_in = self._next_due_in(queues, rescue_from, alone)
        if due_in <= 0:
            await trio.lowlevel.checkpoint()
            return
        with trio.move_on_after(min(timeout, due_in)):
            await self._lot.park()
