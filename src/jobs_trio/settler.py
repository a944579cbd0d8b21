# Where attempts are settled: finished runs hand their settlement here and one task writes them
# in batches. Apart because settles are the hot path's second half: batching, isolating a write
# the database refuses, and bounding what waits to be written all live here.
# Internal: not part of the public API (docs/reference.md lists the public modules).
from __future__ import annotations

import logging
import math

import attrs
import trio

from .boundary import storable_text
from .driver import Driver
from .errors import JobsError, ValueRefused
from .logs import log_event
from .records import (
    CancelJob,
    Complete,
    DeadLetter,
    JobId,
    Park,
    Retry,
    Settlement,
    Suspend,
)

# The last word on a settlement every other form of which was refused: plain ASCII, so no
# driver can refuse it for its text.
LAST_RESORT_ERROR = (
    "[X_REFUSED] the database refused every form of this attempt's settlement;"
    " see the worker's log (jobs.settle.refused) for what it said"
)
# Refusal text kept in the stored error: enough to see what was refused, never a payload.
_REFUSAL_CHARS = 400


@attrs.define
class _Pending:
    settlement: Settlement
    done: trio.Event = attrs.Factory(trio.Event)
    applied: bool = False
    refusals: int = 0  # forms of this settlement the database refused so far


class Settler:
    """Runs as a task of the worker; ``confirmed`` waits until a settlement is written (or
    refused by fencing). Settlements that arrive together are written in one driver call.

    ``capacity`` bounds the settlements handed in and not yet written: the worker waits in
    ``room()`` before it claims, so a slow database slows the claiming instead of piling
    finished work up in memory."""

    def __init__(
        self,
        driver: Driver,
        *,
        capacity: int = 1000,
        max_batch: int = 500,
        retry_cap: float = 5.0,
    ) -> None:
        self._driver = driver
        self._max_batch = max_batch
        self._retry_cap = retry_cap
        self.capacity = capacity
        # Unbounded as a channel: the bound is enforced in room(), before the claim that would
        # produce more work, never by blocking a run that already finished.
        self._send, self._receive = trio.open_memory_channel[_Pending](math.inf)
        self._unwritten: dict[int, _Pending] = {}
        self._written = trio.lowlevel.ParkingLot()
        self._closed = False
        self.peak = 0  # the most settlements ever waiting at once (checked against capacity)
        self.finished = trio.Event()  # set once everything handed in has been written

    @property
    def waiting(self) -> int:
        """Settlements handed in and not yet written."""
        return len(self._unwritten)

    def unwritten(self) -> list[Settlement]:
        return [p.settlement for p in self._unwritten.values()]

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

    def hand_in(self, settlement: Settlement) -> _Pending | None:
        """Queue ``settlement`` for the next batch, synchronously: once handed in it is
        written before the settler finishes, even if the caller stops waiting. None when the
        settler had stopped its intake (nothing will be written)."""
        if self._closed:
            log_event(
                "jobs.timeout.abandoned",
                logging.WARNING,
                job_id=settlement.lease.job_id,
                why="finished after its worker's teardown gave up on it; nothing written",
            )
            return None
        pending = _Pending(settlement)
        self._unwritten[id(pending)] = pending
        self.peak = max(self.peak, len(self._unwritten))
        self._send.send_nowait(pending)
        return pending

    async def confirmed(self, pending: _Pending | None) -> bool:
        """Wait until ``pending`` (from ``hand_in``) is written; answer whether it applied."""
        if pending is None:
            await trio.lowlevel.checkpoint()
            return False
        await pending.done.wait()
        return pending.applied

    def stop_intake(self) -> None:
        """Take no more settlements: the run loop writes what it holds and returns; a later
        ``hand_in`` writes nothing (its run was abandoned at the budget)."""
        self._closed = True
        self._send.close()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        try:
            await self._write_batches()
        finally:
            self.finished.set()

    async def _write_batches(self) -> None:
        carried: _Pending | None = None
        while True:
            if carried is not None:
                first, carried = carried, None
            else:
                try:
                    first = await self._receive.receive()
                except trio.EndOfChannel:
                    return
            batch = [first]
            jobs = {first.settlement.lease.job_id}
            while len(batch) < self._max_batch:
                try:
                    pending = self._receive.receive_nowait()
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
                if pending.settlement.lease.job_id in jobs:
                    # Two runs of one job (a lapsed claim beside its re-claim): a driver says
                    # which settlements applied by job id, so in one batch the fenced one
                    # would pass for written. It goes first in the next batch instead.
                    carried = pending
                    break
                batch.append(pending)
                jobs.add(pending.settlement.lease.job_id)
            await self._write(batch)

    async def _write(self, batch: list[_Pending]) -> None:
        """Write ``batch``, and mark each one done. A refused write is narrowed down by halves
        until the refused settlement stands alone; that one is replaced by a failure its
        driver can store. Only an unreachable database is retried as it was."""
        delay = 0.05
        while True:
            try:
                applied = set(await self._driver.settle([p.settlement for p in batch]))
            except ValueRefused as exc:
                await self._isolate(batch, exc)
                return
            except JobsError as exc:
                # Unreachable, locked, or the file went bad: nothing was written, and dropping
                # it would leave the job running until its lease lapsed and cost it an attempt.
                # The run's lease is still renewed meanwhile; the teardown's budget bounds
                # these retries from outside, and reports what is still here at the end.
                log_event("jobs.settle.retrying", logging.WARNING, jobs=len(batch), error=str(exc))
                await trio.sleep(delay)
                delay = min(delay * 2, self._retry_cap)
                continue
            except Exception as exc:
                # Not a failure we know (a driver bug, a value it chokes on): treated as a
                # refusal, so it can cost at most the one settlement that causes it.
                await self._isolate(batch, exc)
                return
            self._done(batch, applied)
            return

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
            self._done(batch, set())
            return
        pending.settlement = replacement
        await self._write(batch)

    def _done(self, batch: list[_Pending], applied: set[JobId]) -> None:
        for pending in batch:
            pending.applied = pending.settlement.lease.job_id in applied
            self._unwritten.pop(id(pending), None)
            pending.done.set()
        self._written.unpark_all()


def refused_replacement(settlement: Settlement, refusal: str, refusals: int) -> Settlement | None:
    """What to write instead of a settlement the database refused (``refusals`` times so far):
    first the same ending with its text made storable — a result cannot be made storable
    without changing it, so a refused result dead-letters the job with the refusal as its
    error — then a fixed ASCII dead-letter, then nothing."""
    lease = settlement.lease
    said = storable_text(refusal, _REFUSAL_CHARS)
    if refusals == 1:
        match settlement:
            case Complete():
                return DeadLetter(
                    lease,
                    f"[X_REFUSED] the job's result could not be stored ({said}); the body had"
                    " returned: make its result smaller or plainer, then retry the job",
                )
            case Retry(delay=delay, error=error, counts_as_attempt=counts):
                return Retry(lease, delay, storable_text(error), counts_as_attempt=counts)
            case DeadLetter(error=error):
                return DeadLetter(lease, storable_text(error))
            case CancelJob(error=error):
                return CancelJob(lease, storable_text(error))
            case Park(reason=reason):
                return Park(lease, storable_text(reason))
            case Suspend():
                return DeadLetter(
                    lease, f"[X_REFUSED] the job's suspension could not be stored ({said})"
                )
    if refusals <= 2:
        return DeadLetter(lease, LAST_RESORT_ERROR)
    return None
