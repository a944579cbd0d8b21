# Where attempts are settled: finished runs hand their settlement here and one task writes them
# in batches. Apart because settles are the hot path's second half, and batching lives here.
from __future__ import annotations

import logging
import math

import attrs
import trio

from .driver import Driver
from .errors import DriverError
from .logs import log_event
from .records import JobId, Settlement


@attrs.define
class _Pending:
    settlement: Settlement
    done: trio.Event = attrs.Factory(trio.Event)
    applied: bool = False


class Settler:
    """Runs as a task of the worker; ``settle`` waits until its settlement is written (or
    refused by fencing). Settlements that arrive together are written in one driver call."""

    def __init__(self, driver: Driver, *, max_batch: int = 500, retry_cap: float = 5.0) -> None:
        self._driver = driver
        self._max_batch = max_batch
        self._retry_cap = retry_cap
        self._send, self._receive = trio.open_memory_channel[_Pending](math.inf)
        self._closed = False
        self.finished = trio.Event()  # set once everything handed in has been written

    async def settle(self, settlement: Settlement) -> bool:
        """True when the write applied; False when the claim was no longer current, or the
        settler had already closed (the run was abandoned at the budget)."""
        pending = self.hand_in(settlement)
        return await self.confirmed(pending)

    def hand_in(self, settlement: Settlement) -> _Pending | None:
        """Queue ``settlement`` for the next batch, synchronously: once handed in it is
        written before the settler finishes, even if the caller stops waiting. None when the
        settler had already closed (nothing will be written)."""
        if self._closed:
            log_event(
                "jobs.timeout.abandoned",
                logging.WARNING,
                job_id=settlement.lease.job_id,
                why="finished after its worker's teardown gave up on it; nothing written",
            )
            return None
        pending = _Pending(settlement)
        self._send.send_nowait(pending)
        return pending

    async def confirmed(self, pending: _Pending | None) -> bool:
        """Wait until ``pending`` (from ``hand_in``) is written; answer whether it applied."""
        if pending is None:
            await trio.lowlevel.checkpoint()
            return False
        await pending.done.wait()
        return pending.applied

    def close(self) -> None:
        """No more settlements: the run loop writes what it holds and returns."""
        self._closed = True
        self._send.close()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        try:
            await self._write_batches()
        finally:
            self.finished.set()

    async def _write_batches(self) -> None:
        async for first in self._receive:
            batch = [first]
            while len(batch) < self._max_batch:
                try:
                    batch.append(self._receive.receive_nowait())
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
            applied = await self._write(batch)
            for pending in batch:
                pending.applied = pending.settlement.lease.job_id in applied
                pending.done.set()

    async def _write(self, batch: list[_Pending]) -> set[JobId]:
        # A settle that cannot reach the database is retried, not dropped: dropping it would
        # leave the job running until its lease lapsed and cost it an attempt. The teardown's
        # budget bounds these retries from outside.
        delay = 0.05
        while True:
            try:
                return set(await self._driver.settle([p.settlement for p in batch]))
            except DriverError as exc:
                log_event("jobs.settle.retrying", logging.WARNING, jobs=len(batch), error=str(exc))
                await trio.sleep(delay)
                delay = min(delay * 2, self._retry_cap)
