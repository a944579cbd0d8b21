# The memory driver's fleet: workers' presence, paused queues and who has heard of a pause.
# Apart because it is what the workers tell each other, not what a job is.
from __future__ import annotations

from collections.abc import Sequence

import trio

from ..._core.records import (
    JobState,
    PauseHolder,
    PauseLook,
    QueuePause,
    WorkerPresence,
)
from .._rules import (
    FORGET_WORKERS_AFTER,
)
from ._store import MemoryStore


class MemoryFleet(MemoryStore):
    """The fleet: workers' presence and the queues' pauses."""

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
