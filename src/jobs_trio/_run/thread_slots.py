# Where sync job bodies run: threads of the worker's own limiter, sized to its concurrency, and the
# slots that threads abandoned at their cancel still hold. Apart because a thread is the one part
# of a run Trio cannot stop, and its accounting outlives the run that started it.
from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any, TypeVar, cast

import trio

from .run_scope import RunScope

T = TypeVar("T")


class ThreadSlots:
    """A worker's sync-body threads. Its own limiter, so hung bodies never exhaust Trio's default
    one (which the SQLite driver's own threads use too); and a thread abandoned at its run's
    cancel keeps its queue's slot until it really ends, so a worker never starts more threads
    than its concurrency and a job holding a slot never waits for a thread."""

    def __init__(self, limits: Mapping[str, int], on_freed: Callable[[], object]) -> None:
        """``limits``: each queue's slots; as many threads at once as all of them."""
        self.limiter = trio.CapacityLimiter(sum(limits.values()))
        # Threads of each queue abandoned at their cancel and still running: read by the
        # slots at every run's start and end, where a method call each was a share of it.
        # Each queue's at 0 from the start (a missing key is a __missing__ call).
        self.lingering_by_queue: Counter[str] = Counter(dict.fromkeys(limits, 0))
        self._on_freed = on_freed

    def lingering(self, queue: str) -> int:
        """Threads of ``queue`` abandoned at their cancel and still running."""
        return self.lingering_by_queue[queue]

    async def run(self, run: RunScope, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in a thread; call it inside ``run.thread_scope()``, whose cancel
        abandons the thread. The run's timeout starts when the thread does."""
        body = _BodyThread(self, run)
        try:
            return await trio.to_thread.run_sync(
                fn,
                *args,
                abandon_on_cancel=True,
                # Trio calls acquire before the thread starts and release once it has really
                # ended (also when abandoned): any object with these two methods will do.
                limiter=cast(trio.CapacityLimiter, body),
            )
        except trio.Cancelled:
            body.abandoned()
            raise

    def _linger(self, queue: str) -> None:
        self.lingering_by_queue[queue] += 1

    def _ended(self, queue: str) -> None:
        self.lingering_by_queue[queue] -= 1
        self._on_freed()


class _BodyThread:
    """The limiter handed to ``trio.to_thread.run_sync`` for one body."""

    def __init__(self, slots: ThreadSlots, run: RunScope) -> None:
        self._slots = slots
        self._run = run
        self._started = False
        self._ended = False
        self._lingering = False

    async def acquire_on_behalf_of(self, borrower: object) -> None:
        await self._slots.limiter.acquire_on_behalf_of(borrower)
        self._started = True
        self._run.start_clock()

    def release_on_behalf_of(self, borrower: object) -> None:
        self._slots.limiter.release_on_behalf_of(borrower)
        self._ended = True
        if self._lingering:
            self._slots._ended(self._run.claim.queue)

    def abandoned(self) -> None:
        # Both this and release run on the Trio thread, so there is no race between them: a
        # thread that already ended never lingers.
        if self._started and not self._ended:
            self._lingering = True
            self._slots._linger(self._run.claim.queue)
