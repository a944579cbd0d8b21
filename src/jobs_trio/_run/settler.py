# Where attempts are settled: finished runs hand their settlement here and one task writes them
# in batches. Apart because settles are the hot path's second half: batching, isolating a write
# the database refuses, and bounding what waits to be written all live here.
from __future__ import annotations

import collections
import logging
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from typing import Any, TypeVar, cast

import trio

from .._core.boundary import storable_text
from .._core.errors import ConfigError, DriverError, JobsError, RowLocked, ValueRefused
from .._core.logs import log_event
from .._core.records import (
    AttemptNote,
    AttemptRecord,
    CancelJob,
    Claim,
    Complete,
    DeadLetter,
    JobId,
    JobState,
    OutcomeKind,
    Park,
    Retry,
    Settlement,
    Suspend,
)
from .._core.shared_keys import share_keys
from ..drivers._rows import stored_value
from ..drivers._rules import history_outcome
from ..drivers.contract import Driver, SettlesWithClaims
from .outage import Outage

# The last word on a settlement every other form of which was refused: plain ASCII, so no
# driver can refuse it for its text.
LAST_RESORT_ERROR = (
    "[X_REFUSED] the database refused every form of this attempt's settlement;"
    " see the worker's log (jobs.settle.refused) for what it said"
)
# Refusal text kept in the stored error: enough to see what was refused, never a payload.
_REFUSAL_CHARS = 400
# The scheduling passes with no claim in flight, each with a settlement handed in, that the
# writer leaves for a claim to carry what waits before it writes it alone (_leave_to_claims).
_PASSES_FOR_A_CLAIM = 2
# And how long it waits for a claim in flight to answer (seconds): a claim's round trip is a
# millisecond or two when the database keeps up; one held up longer (a lock, a stall) is not
# waited for. At least CARRY_WAIT, and up to CARRY_ROUND_TRIPS of the worker's recent claims'
# round trips (a running mean, each counted up to CARRY_WAIT_MOST), never past that bound: on
# SQLite a claim of a few hundred jobs takes 10-20 ms, and a write sent at 20 ms could not start
# before the claim ended (one connection) while the next claim, which would have carried it,
# waited behind it (issue 44: one door call in three at c=10).
CARRY_WAIT = 0.02
CARRY_ROUND_TRIPS = 3
CARRY_WAIT_MOST = 0.2
# How fast that mean follows the claims: each claim's round trip counts this much.
_ROUND_TRIP_WEIGHT = 0.25
# A settlement whose row stays locked is logged once its backoff reaches this (its 4th try).
_LOCK_WARN_AFTER = 0.4
# Reads of a job's history to tell a write whose answer was lost (about 3 s of retries).
_READ_BACK_TRIES = 8
# What a read back answers (_read_back): a history, or a job's record.
_Read = TypeVar("_Read")


class _Pending:
    """One settlement handed in, until it is written. What it starts with is on the class, set
    on the instance only when it changes: one is made per finished attempt, and an attrs class
    of ten fields, each assigned at every one, was a sixth of the settler's share of a no-op
    job (issue 44). Compared by identity: two pendings of equal fields are two settlements."""

    # Called once, synchronously, with the settlement when its write is confirmed (or the
    # settler ends without it): how a run whose task has already ended is released.
    on_written: Callable[[Settlement], object] | None = None
    over = False  # written, refused for good, or dropped: nothing more will happen
    # Made only for a caller that waits (``confirmed``): the worker's runs don't, and an
    # event per job and the wake it costs were the last thing a finished run waited for.
    done: trio.Event | None = None
    applied = False
    refusals = 0  # forms of this settlement the database refused so far
    # Given back by a claim that carried it and was refused: never carried again, only the
    # writer takes it, so a settlement the database refuses is isolated there (by halves)
    # instead of failing claim after claim.
    solo = False
    # Its row was locked by another session: written again by the retry task at retry_at,
    # after a backoff of lock_delay.
    lock_delay = 0.0
    retry_at = 0.0
    # A write of it failed with no answer (the connection dropped): it may have committed
    # then. The driver's clock before that try; a later try the fence refuses is then read
    # back (_written_before) rather than reported fenced.
    uncertain_since: float | None = None

    def __init__(
        self, settlement: Settlement, on_written: Callable[[Settlement], object] | None = None
    ) -> None:
        self.settlement = settlement
        if on_written is not None:
            self.on_written = on_written

    # Whether a claim may carry it: not once it is ``solo`` or uncertain (set with either). An
    # uncertain one is the writer's alone: only its write is read back when fenced (a claim
    # that carried it again, its first try committed, reported it fenced: a finished result
    # that was written, announced as dropped). A plain attribute, read for each settlement a
    # claim takes.
    carriable = True


share_keys(_Pending, "settlement")


class Settler:
    """Runs as a task of the worker; ``confirmed`` waits until a settlement is written (or
    refused by fencing). Settlements that arrive together are written in one driver call.

    ``capacity`` bounds the settlements handed in and not yet written: the worker waits in
    ``room()`` before it claims, so a slow database slows the claiming instead of piling
    finished work up in memory.

    With ``carried_by_claims``, the worker's claim loop may take the waiting settlements with
    its next claim (``take_for_claim``: one round trip writes them and claims, where there were
    two); the writer then leaves them one scheduling pass to be taken before it writes them
    itself, and writes whatever a claim returns to it (``return_carried``)."""

    def __init__(
        self,
        driver: Driver,
        *,
        capacity: int | Callable[[], int] = 1000,
        max_batch: int = 500,
        retry_cap: float = 1.0,
        carried_by_claims: bool = False,
        outage: Outage | None = None,
        worker_id: str | None = None,
    ) -> None:
        self._driver = driver
        self._outage = outage
        self._worker_id = worker_id  # named in what it reports lost
        # A write that failed for an unreachable database is being retried: the worker's claim
        # loop waits (``flowing``) so that its finished work lands before its next claim.
        self.stalled = False
        self._flowing = trio.lowlevel.ParkingLot()
        self._max_batch = max_batch
        self._retry_cap = retry_cap
        self._carried_by_claims = carried_by_claims
        self._capacity = capacity
        # Unbounded: the bound is enforced in room(), before the claim that would produce
        # more work, never by blocking a run that already finished. A deque rather than a
        # channel: two takers (the writer, a claim) and a give-back to the front.
        self._queue: collections.deque[_Pending] = collections.deque()
        self._arrived = trio.lowlevel.ParkingLot()
        # Whether the writer waits in ``_arrived`` for a settlement: asked at every hand-in,
        # where the lot's own __bool__ was a call per finished run (the writer is mostly busy).
        self._writer_waits = False
        self._unwritten: dict[int, _Pending] = {}
        self._written = trio.lowlevel.ParkingLot()
        self._closed = False
        # Whether what is unwritten has been named already (abandonment.report_unwritten, at the
        # teardown's deadline): else the settler's end names it (lost_settlement).
        self.reported = False
        self.dropped: tuple[str, ...] = ()  # the jobs it named so
        # Settlements whose row another session holds locked: retried alone by their own task,
        # so the writer never waits on a lock in front of every other job's settlement.
        self._locked: collections.deque[_Pending] = collections.deque()
        self._locked_arrived = trio.lowlevel.ParkingLot()
        self._writer_done = False
        # Claims carrying settlements, in flight, and settlements handed in so far: how the
        # writer leaves a claim its chance to carry them (see _write_batches).
        self._claims_in_flight = 0
        self._handed_in = 0
        # The running mean of the claims' round trips (Settler.claim), which the carry wait
        # covers a few times over; None until a claim was answered.
        self._round_trip: float | None = None
        self._claims_stopped = False
        self._claim_answered = trio.lowlevel.ParkingLot()
        self.peak = 0  # the most settlements ever waiting at once (checked against capacity)
        self.finished = trio.Event()  # set once everything handed in has been written

    @property
    def capacity(self) -> int:
        """The most settlements handed in and unwritten before the claiming waits: a number, or
        what a function answers now (the worker's slots and its claims ahead as sized now)."""
        capacity = self._capacity
        return capacity if isinstance(capacity, int) else capacity()

    @property
    def carriable(self) -> bool:
        """Whether settlements wait that the next claim would carry."""
        return (
            self._carried_by_claims
            and not self._closed
            and bool(self._queue)
            and self._queue[0].carriable
        )

    @property
    def waiting(self) -> int:
        """Settlements handed in and not yet written."""
        return len(self._unwritten)

    def unwritten(self) -> list[Settlement]:
        return [p.settlement for p in self._unwritten.values()]

    async def flowing(self) -> None:
        """Return once no write is being retried for an unreachable database."""
        while self.stalled:
            await self._flowing.park()
        await trio.lowlevel.checkpoint()

    def _reached(self, sent_at: float) -> None:
        if self._outage is not None:
            self._outage.reached(sent_at)
        if self.stalled:
            self.stalled = False
            self._flowing.unpark_all()

    async def next_write(self) -> None:
        """Return once the next write is confirmed (or refused by fencing)."""
        await self._written.park()

    async def room(self) -> None:
        """Return once fewer than ``capacity`` settlements wait to be written."""
        while len(self._unwritten) >= self.capacity:
            await self._written.park()
        await trio.lowlevel.checkpoint()

    async def settle(self, settlement: Settlement) -> bool:
        """True when the write applied; False when the claim was no longer current, or the
        settler had stopped its intake (the run was abandoned at the budget)."""
        pending = self.hand_in(settlement)
        return await self.confirmed(pending)

    def hand_in(
        self, settlement: Settlement, on_written: Callable[[Settlement], object] | None = None
    ) -> _Pending | None:
        """Queue ``settlement`` for the next batch, synchronously: once handed in it is
        written before the settler finishes, even if the caller stops waiting. None when the
        settler had stopped its intake (nothing will be written, and ``on_written`` is not
        called). ``on_written`` is called with it once the write is confirmed, or when the
        settler ends without having written it (its teardown's budget ran out)."""
        if self._closed:
            log_event(
                "jobs.timeout.abandoned",
                logging.WARNING,
                job_id=settlement.lease.job_id,
                why="finished after its worker's teardown gave up on it; nothing written",
            )
            return None
        pending = _Pending(settlement, on_written)
        self._handed_in += 1
        unwritten = self._unwritten
        unwritten[id(pending)] = pending
        if len(unwritten) > self.peak:
            self.peak = len(unwritten)
        self._queue.append(pending)
        if self._writer_waits:
            self._arrived.unpark_all()
        return pending

    async def confirmed(self, pending: _Pending | None) -> bool:
        """Wait until ``pending`` (from ``hand_in``) is written; answer whether it applied."""
        if pending is None:
            await trio.lowlevel.checkpoint()
            return False
        if not pending.over:
            if pending.done is None:
                pending.done = trio.Event()
            await pending.done.wait()
        else:
            await trio.lowlevel.checkpoint()
        return pending.applied

    def claims_stopped(self) -> None:
        """The worker claims no more: no claim will carry what waits, which is written now."""
        self._claims_stopped = True
        self._claim_answered.unpark_all()

    def stop_intake(self) -> None:
        """Take no more settlements: the run loop writes what it holds and returns; a later
        ``hand_in`` writes nothing (its run was abandoned at the budget)."""
        self._closed = True
        self._arrived.unpark_all()
        self._claim_answered.unpark_all()

    async def claim(
        self,
        driver: Driver,
        queues: Sequence[str],
        limit: Mapping[str, int],
        *,
        lease: float,
        worker_id: str,
        carried: list[_Pending] | None = None,
        **options: Any,
    ) -> Sequence[Claim]:
        """``driver.claim(...)``, carrying the settlements that wait to be written when the
        driver writes both in one round trip (``Capabilities.settles_with_claims``): at
        concurrency 1 every job's settle then rides on the next job's claim. On any failure
        nothing of the call was written (one write, or none), and the settlements come back
        here to be written as they would have been. ``carried``: what ``take_for_claim``
        gave the caller when it decided to claim (else taken now)."""
        if carried is None:
            carried = self.take_for_claim()
        sent_at = trio.current_time()
        if not carried:
            claims = await driver.claim(queues, limit, lease=lease, worker_id=worker_id, **options)
            self._answered_after(sent_at)
            return claims
        both = cast(SettlesWithClaims, driver)  # carried only when its capabilities say so
        tried_at = driver.now()
        # In flight (the writer leaves what waits to the next claim: _leave_to_claims) only
        # while this call is; a claim after a refusal below carries nothing.
        self._claims_in_flight += 1
        try:
            applied, claims = await both.settle_and_claim(
                [pending.settlement for pending in carried],
                queues,
                limit,
                lease=lease,
                worker_id=worker_id,
                **options,
            )
        except RowLocked as exc:
            # A row of it locked by another session: a settle alone (no slot to claim for)
            # may have written the rest; what was written is kept, the others are written
            # alone from now on, and this claim goes on without them.
            self.return_carried_locked(carried, exc)
        except ValueRefused:
            self.return_carried(carried, solo=True)
        except DriverError:
            self.return_carried(carried, solo=False, uncertain_since=tried_at)
            raise  # the claim failed: the claim loop's own handling
        except ConfigError:
            # The database cannot be written at all (its file replaced, read-only, not a
            # database): nothing carried is refused for its values, and the worker stops on
            # it, naming what it could not write. Taken for a refusal, a finished job's result
            # was isolated and dropped without a word.
            self.return_carried(carried, solo=False, uncertain_since=tried_at)
            raise
        except Exception:
            # Not a failure we know (a driver bug, a value it chokes on): as the writer treats
            # one, a refusal of something carried (which may have committed all the same).
            self.return_carried(carried, solo=True, uncertain_since=tried_at)
        except BaseException:
            self.return_carried(carried, solo=False, uncertain_since=tried_at)  # the budget
            raise
        else:
            self.written(carried, applied)
            self._answered_after(sent_at)
            return claims
        finally:
            self._claims_in_flight -= 1
            self._claim_answered.unpark_all()
        # Refused: alone from now on, the writer isolates the refused settlement (it never
        # fails a claim again), and this claim goes without them.
        return await driver.claim(queues, limit, lease=lease, worker_id=worker_id, **options)

    def _answered_after(self, sent_at: float) -> None:
        """A claim sent at ``sent_at`` (Trio clock) was answered now: its round trip counts in
        the mean the carry wait covers (``_carry_wait``), up to CARRY_WAIT_MOST, so that one
        claim held up by a stall does not make every later wait its length."""
        took = min(trio.current_time() - sent_at, CARRY_WAIT_MOST)
        mean = self._round_trip
        self._round_trip = took if mean is None else mean + _ROUND_TRIP_WEIGHT * (took - mean)

    def _carry_wait(self) -> float:
        """How long what waits is left to a claim in flight: see CARRY_WAIT."""
        mean = self._round_trip
        if mean is None:
            return CARRY_WAIT
        return min(max(CARRY_WAIT, CARRY_ROUND_TRIPS * mean), CARRY_WAIT_MOST)

    def take_for_claim(self) -> list[_Pending]:
        """The waiting settlements a claim may carry (none once the intake stopped: the
        teardown's writes are the writer's). The caller reports back with ``written`` or
        ``return_carried``; until then they stay unwritten (and are named if the budget ends)."""
        if not self._carried_by_claims or self._closed:
            return []
        return self._take(by_writer=False)

    def written(self, batch: list[_Pending], applied: Collection[JobId]) -> None:
        """``batch`` (from ``take_for_claim``) was written with a claim."""
        self._done(batch, set(applied))

    def return_carried_locked(self, batch: list[_Pending], exc: RowLocked) -> None:
        """``batch`` (from ``take_for_claim``) met a row another session holds locked: what the
        call wrote is done, the locked ones go to the retry task, and when it wrote nothing
        the writer writes them all, alone from now on."""
        if not self._written_past_lock(batch, exc):
            self.return_carried(batch, solo=True)

    def _written_past_lock(
        self, batch: list[_Pending], exc: RowLocked, earlier: Collection[JobId] = ()
    ) -> bool:
        """When the driver wrote ``batch`` past a locked row (exc.written, exc.busy): mark the
        written done (and those an ``earlier`` try wrote; the rest, fenced), hand the locked
        ones to the retry task; True. A RowLocked that wrote nothing: False, nothing done."""
        if not (exc.written or exc.busy):
            return False
        self._done(
            [p for p in batch if p.settlement.lease.job_id not in exc.busy],
            set(exc.written) | set(earlier),
        )
        for pending in batch:
            if pending.settlement.lease.job_id in exc.busy:
                self._defer_locked(pending, exc)
        return True

    def return_carried(
        self, batch: list[_Pending], *, solo: bool, uncertain_since: float | None = None
    ) -> None:
        """``batch`` (from ``take_for_claim``) was not written: the writer writes it, first,
        in its order; never carried again when ``solo`` (the database refused the claim that
        carried it). ``uncertain_since``: the call failed with no answer, and may have
        committed (see _Pending.uncertain_since)."""
        for pending in reversed(batch):
            pending.solo = pending.solo or solo
            if uncertain_since is not None and pending.uncertain_since is None:
                pending.uncertain_since = uncertain_since
            pending.carriable = not pending.solo and pending.uncertain_since is None
            self._queue.appendleft(pending)
        if batch:
            self._arrived.unpark_all()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._retry_locked)
                try:
                    await self._write_batches()
                finally:
                    # The retry task ends once nothing more can be deferred to it.
                    self._writer_done = True
                    self._locked_arrived.unpark_all()
        finally:
            # Cut short (the teardown's budget ran out, after it named what was unwritten; or a
            # task of the worker failed, and no one did): whoever waits on a write that will
            # not happen is released, so nothing counts a run that ended as in flight for ever.
            for pending in list(self._unwritten.values()):
                if not self.reported:
                    # A worker stopped by an error (its database file replaced) logged the job
                    # completed and exited with no word of the result it dropped.
                    lost_settlement(pending.settlement, self._worker_id)
                    self.dropped += (pending.settlement.lease.job_id,)
                self._release(pending)
            self.finished.set()

    async def _write_batches(self) -> None:
        while True:
            while not self._queue:
                if self._closed:
                    return
                self._writer_waits = True
                try:
                    await self._arrived.park()
                finally:
                    self._writer_waits = False
            if self._carried_by_claims and not self._closed:
                # A claim that carries them writes these in its round trip (one where a write
                # of their own would be another, issue 35).
                await self._leave_to_claims()
            batch = self._take(by_writer=True)
            if batch:
                await self._write(batch)

    async def _leave_to_claims(self) -> None:
        """Wait while the claim loop may carry what waits here: as long as its claims that
        carry settlements are in flight (the next one, sent at the answer, takes what arrived
        meanwhile), and for a pass after each arrival (a run that hands one in frees its slot
        too, and wakes the claim loop). Bounded by looks with no claim in flight: a claim
        loop with no room claims nothing, and these are written here; and by CARRY_WAIT for
        each claim in flight (or a few of its recent round trips, ``_carry_wait``): one that
        takes longer leaves them to be written alone, as they are once claiming has stopped."""
        quiet = 0
        while quiet < _PASSES_FOR_A_CLAIM and not self._closed and not self._claims_stopped:
            if self._claims_in_flight:
                # Not past the bound: a claim that waits on a lock, or hangs on a stalled
                # connection, must not hold up writes the database would take at once (a
                # drain's budget could end with these unwritten: their jobs run again).
                with trio.move_on_after(self._carry_wait()):
                    await self._claim_answered.park()
                    continue
                return
            seen = self._handed_in
            # Two passes: one handed in just before this look freed its run's slot in the same
            # pass, and the claim loop that slot woke claims in the next one.
            await trio.lowlevel.checkpoint()
            await trio.lowlevel.checkpoint()
            if self._claims_in_flight:
                continue
            if self._handed_in == seen:
                return
            quiet += 1

    async def _retry_locked(self) -> None:
        """Write the settlements whose rows were locked, each once its backoff has passed (those
        due together in one batch), until each lands or the settler is cut short; ends once the
        writer has ended and none is left."""
        while True:
            while not self._locked:
                if self._writer_done:
                    return
                await self._locked_arrived.park()
            # A deferral that arrives meanwhile may be due sooner: look again when one does.
            with trio.move_on_at(min(p.retry_at for p in self._locked)):
                await self._locked_arrived.park()
                continue
            now = trio.current_time()
            batch: list[_Pending] = []
            jobs: set[JobId] = set()
            for pending in list(self._locked):
                job_id = pending.settlement.lease.job_id
                if pending.retry_at <= now and job_id not in jobs:  # (see _take)
                    self._locked.remove(pending)
                    batch.append(pending)
                    jobs.add(job_id)
            await self._write(batch)  # landed, refused for good, or some locked again

    def _defer_locked(self, pending: _Pending, exc: RowLocked) -> None:
        pending.lock_delay = min(max(pending.lock_delay * 2, 0.05), self._retry_cap)
        pending.retry_at = trio.current_time() + pending.lock_delay
        if pending.lock_delay >= _LOCK_WARN_AFTER:
            # Not at once: a renewal of this worker's own runs holds their rows for a moment,
            # and a settle meeting one is written again 50 ms later, which is no news. A lock
            # still there after a few tries is someone else's.
            log_event(
                "jobs.settle.row-locked",
                logging.WARNING,
                job_id=pending.settlement.lease.job_id,
                settlement=type(pending.settlement).__name__,
                error=str(exc),
                retry_in=round(pending.lock_delay, 2),
            )
        self._locked.append(pending)
        self._locked_arrived.unpark_all()

    def _take(self, *, by_writer: bool) -> list[_Pending]:
        """Up to max_batch from the front. Two runs of one job (a lapsed claim beside its
        re-claim) never share a batch: a driver says which settlements applied by job id, so
        in one batch the fenced one would pass for written; the second waits for the next.
        A claim (not ``by_writer``) takes only carriable ones, up to the first that is not."""
        batch: list[_Pending] = []
        jobs: set[JobId] = set()
        queue, most = self._queue, self._max_batch
        while queue and len(batch) < most:
            pending = queue[0]
            job_id = pending.settlement.lease.job_id
            if job_id in jobs or not (by_writer or pending.carriable):
                break
            batch.append(queue.popleft())
            jobs.add(job_id)
        return batch

    async def _write(self, batch: list[_Pending]) -> None:
        """Write ``batch``, and mark each one done. A refused write is narrowed down by halves
        until the refused settlement stands alone; that one is replaced by a failure its
        driver can store. Only an unreachable database is retried as it was."""
        delay = 0.05
        while True:
            sent_at = trio.current_time()
            tried_at = self._driver.now()
            try:
                applied = set(await self._driver.settle([p.settlement for p in batch]))
            except ValueRefused as exc:
                _may_have_written(batch, tried_at)
                await self._isolate(batch, exc)
                return
            except RowLocked as exc:
                # A row of the batch is locked by another session. Written past it, see
                # _written_past_lock; failed whole, every other settlement is written now, each
                # alone (one lock wait for the locked one, not one per half).
                unlocked = [p for p in batch if p.settlement.lease.job_id not in exc.busy]
                earlier = await self._written_before(unlocked, set(exc.written))
                if self._written_past_lock(batch, exc, earlier):
                    return
                if len(batch) == 1:
                    self._defer_locked(batch[0], exc)
                    return
                for pending in batch:
                    await self._write([pending])
                return
            except JobsError as exc:
                # Unreachable, locked, or the file went bad: nothing was written, and dropping
                # it would leave the job running until its lease lapsed and cost it an attempt.
                # The run's lease is still renewed meanwhile; the teardown's budget bounds
                # these retries from outside, and reports what is still here at the end. Every
                # retry within a second of the last (retry_cap): once the database is back,
                # these finished jobs are written before a claim (anyone's) takes them again.
                if self._outage is not None:
                    self._outage.unreachable()
                _mark_uncertain(batch, tried_at)
                self.stalled = True
                log_event("jobs.settle.retrying", logging.WARNING, jobs=len(batch), error=str(exc))
                await trio.sleep(delay)
                delay = min(delay * 2, self._retry_cap)
                continue
            except Exception as exc:
                # Not a failure we know (a driver bug, a value it chokes on): treated as a
                # refusal, so it can cost at most the one settlement that causes it.
                self._reached(sent_at)
                _may_have_written(batch, tried_at)
                await self._isolate(batch, exc)
                return
            self._reached(sent_at)
            if any(p.uncertain_since is not None for p in batch):
                applied |= await self._written_before(batch, applied)
            self._done(batch, applied)
            return

    async def _written_before(self, batch: list[_Pending], applied: set[JobId]) -> set[JobId]:
        """The settlements of ``batch`` the fence refused now that an earlier try of theirs,
        whose answer was lost, had written: the job's newest history record is this attempt's,
        by this worker, ended since that try as it ended (_is_this_attempt), and a completed
        job holds its result. Not a fenced ending (reported as one, it read as
        a finished result dropped, issue 32); a settlement without a note cannot be told, and
        a read that fails leaves it reported fenced."""
        found: set[JobId] = set()
        for pending in batch:
            job_id, note = pending.settlement.lease.job_id, pending.settlement.note
            since = pending.uncertain_since
            if job_id in applied or note is None or since is None:
                continue
            settlement = pending.settlement
            history = await self._read_back(self._driver.load_attempts, job_id)
            if not (history and _is_this_attempt(history[-1], settlement, note, since)):
                continue
            if isinstance(settlement, Complete):
                # A rerun of the same attempt here, ended in the same seconds, records alike:
                # the job holds this result, or it was not this write.
                job = await self._read_back(self._driver.get, job_id)
                held = None if job is None else (job.state, job.result)
                if held != (JobState.COMPLETED, stored_value(settlement.result)):
                    continue
            found.add(job_id)
            log_event(
                "jobs.settle.written-earlier",
                job_id=job_id,
                settlement=type(settlement).__name__,
                why="an earlier try of this write committed, but its answer was lost",
            )
        return found

    async def _read_back(
        self, read: Callable[[JobId], Awaitable[_Read | None]], job_id: JobId
    ) -> _Read | None:
        """``read(job_id)`` (the job's history, or its record), again while the database does
        not answer (it answered the write a moment ago: just after an outage, another pooled
        connection may still be a dead one), a few times; None when it never answered."""
        delay = 0.05
        for tries_left in reversed(range(_READ_BACK_TRIES)):
            try:
                return await read(job_id)
            except DriverError:
                if not tries_left:
                    return None
                await trio.sleep(delay)
                delay = min(delay * 2, self._retry_cap)
            except JobsError:
                return None
        return None

    async def _isolate(self, batch: list[_Pending], refusal: Exception) -> None:
        if len(batch) > 1:
            middle = len(batch) // 2
            await self._write(batch[:middle])
            await self._write(batch[middle:])
            return
        [pending] = batch
        pending.refusals += 1
        settlement = pending.settlement
        text = f"{type(refusal).__name__}: {refusal}"
        replacement = refused_replacement(settlement, text, pending.refusals)
        log_event(
            "jobs.settle.refused",
            logging.ERROR,
            job_id=settlement.lease.job_id,
            settlement=type(settlement).__name__,
            error=ascii(text[:_REFUSAL_CHARS]),
            replaced_by=type(replacement).__name__ if replacement else None,
        )
        if replacement is None:
            # Nothing left to try: the job stays running until its lease lapses, and the
            # worker says so loudly rather than loop on it.
            log_event(
                "jobs.settle.lost",
                logging.ERROR,
                job_id=settlement.lease.job_id,
                fix="the database refuses even a plain-ASCII dead-letter for this job: check"
                " its constraints and triggers; the job runs again when its lease lapses",
            )
            self._done(batch, set(), reported=True)
            return
        pending.settlement = replacement
        await self._write(batch)

    def _done(self, batch: list[_Pending], applied: set[JobId], *, reported: bool = False) -> None:
        for pending in batch:
            pending.applied = pending.settlement.lease.job_id in applied
            if not pending.applied and not reported:
                # Fenced: the claim's lease had lapsed and the job is another run's now (or
                # was buried). That run's ending stands; this one's is dropped, and must not
                # be dropped without a word (a finished body's result included).
                log_event(
                    "jobs.settle.fenced",
                    logging.WARNING,
                    job_id=pending.settlement.lease.job_id,
                    settlement=type(pending.settlement).__name__,
                    why="not written: this run's lease had lapsed and the job was taken by"
                    " another run (or buried) before its ending reached the database",
                )
            self._release(pending)
        self._written.unpark_all()

    def _release(self, pending: _Pending) -> None:
        self._unwritten.pop(id(pending), None)
        pending.over = True
        if pending.on_written is not None:
            pending.on_written(pending.settlement)
        if pending.done is not None:
            pending.done.set()


def _may_have_written(batch: list[_Pending], tried_at: float) -> None:
    """A write of ``batch`` was refused: part of it may have committed all the same (a
    PostgreSQL settle writes the rows it can at once, then waits for a locked one, and only
    that second statement was refused), so what the fence refuses when it is written again is
    read back (_written_before), not reported fenced: a finished result that was written,
    announced as dropped. One settlement alone was written whole or not at all."""
    if len(batch) > 1:
        _mark_uncertain(batch, tried_at)


def _mark_uncertain(batch: list[_Pending], tried_at: float) -> None:
    """``batch`` may have been written by a try at ``tried_at`` (the driver's clock) that
    answered nothing to go by: the writer's alone from here (never carried by a claim), and
    read back when the fence refuses it (_written_before)."""
    for pending in batch:
        if pending.uncertain_since is None:
            pending.uncertain_since = tried_at
            pending.carriable = False


# How far apart a note's seconds and its record's may read: PostgreSQL stores them as whole
# nanoseconds.
_SECONDS_STORED_WITHIN = 2e-9


def _is_this_attempt(
    record: AttemptRecord, settlement: Settlement, note: AttemptNote, since: float
) -> bool:
    """Whether ``record`` is what ``settlement`` wrote: its attempt, worker and time, and its
    ending and body's seconds too. The first three alone matched a rescue's record (another
    claim found the lease lapsed: an orphaning names the lapsed run's attempt and worker, with
    no seconds) and a rerun of the same attempt here, and reported a result that was never
    stored as written (found by review)."""
    if not (
        record.attempt == note.attempt
        and record.worker_id == note.worker_id
        and record.ended_at >= since
        # An operator's pending cancel records any ending as cancelled.
        and record.outcome in (history_outcome(settlement), OutcomeKind.CANCELLED.value)
    ):
        return False
    if record.seconds is None or note.seconds is None:
        return record.seconds is None and note.seconds is None
    return abs(record.seconds - note.seconds) <= _SECONDS_STORED_WITHIN


def refused_replacement(settlement: Settlement, refusal: str, refusals: int) -> Settlement | None:
    """What to write instead of a settlement the database refused (``refusals`` times so far):
    first the same ending with its text made storable — a result cannot be made storable
    without changing it, so a refused result dead-letters the job with the refusal as its
    error — then a fixed ASCII dead-letter, then nothing."""
    lease = settlement.lease
    note = settlement.note  # the attempt's line in the job's history stays
    said = storable_text(refusal, _REFUSAL_CHARS)
    if refusals == 1:
        match settlement:
            case Complete():
                return DeadLetter(
                    lease,
                    f"[X_REFUSED] the job's result could not be stored ({said}); the body had"
                    " returned: make its result smaller or plainer, then retry the job",
                    note=note,
                )
            case Retry(delay=delay, error=error, hands_back=hands_back):
                return Retry(lease, delay, storable_text(error), hands_back=hands_back, note=note)
            case DeadLetter(error=error):
                return DeadLetter(lease, storable_text(error), note=note)
            case CancelJob(error=error):
                return CancelJob(lease, storable_text(error), note=note)
            case Park(reason=reason):
                return Park(lease, storable_text(reason), note=note)
            case Suspend():
                return DeadLetter(
                    lease,
                    f"[X_REFUSED] the job's suspension could not be stored ({said})",
                    note=note,
                )
    if refusals <= 2:
        # Without its note: its traceback text may be what the database refused.
        return DeadLetter(lease, LAST_RESORT_ERROR)
    return None


def lost_settlement(settlement: Settlement, worker_id: str | None) -> None:
    """Name a settlement that will not be written: a finished attempt's ending dropped, which
    must never pass in silence (the process exits non-zero as well)."""
    log_event(
        "jobs.worker.settle-abandoned",
        logging.ERROR,
        **({} if worker_id is None else {"worker": worker_id}),
        job_id=settlement.lease.job_id,
        outcome=type(settlement).__name__,
    )
