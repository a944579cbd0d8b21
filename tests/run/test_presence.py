# The worker's presence goodbye: said as the worker ends, and never past the end of the
# teardown's budget (a database that stopped answering must not hold the process past it).
from __future__ import annotations

import math

import trio
import trio.testing

from jobs_trio._core.records import WorkerPresence
from jobs_trio._run.presence import GOODBYE_WITHIN, announce_presence
from jobs_trio.drivers.memory import MemoryDriver


class UnansweredGoodbye(MemoryDriver):
    """A database that takes announcements and then stops answering: the goodbye hangs."""

    def __init__(self) -> None:
        super().__init__(clock=trio.current_time)
        self.goodbye_asked_at: float | None = None

    async def worker_gone(self, worker_id: str) -> None:
        self.goodbye_asked_at = trio.current_time()
        await trio.sleep_forever()


def describe(started_at: float, now: float) -> WorkerPresence:
    return WorkerPresence(
        worker_id="w1",
        host="h",
        pid=1,
        queues=("default",),
        concurrency=1,
        running=0,
        state="running",
        version="0",
        started_at=started_at,
        seen_at=now,
        every=10.0,
    )


async def goodbye_took(goodbye_by: float) -> float:
    """How long the presence task took to end once cancelled, its goodbye unanswered."""
    driver = UnansweredGoodbye()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(announce_presence, driver, describe, 10.0, lambda: goodbye_by)
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    assert driver.goodbye_asked_at is not None
    return trio.current_time() - driver.goodbye_asked_at


async def test_an_unanswered_goodbye_is_given_up_after_a_second(autojump_clock: object) -> None:
    assert await goodbye_took(math.inf) == GOODBYE_WITHIN


async def test_an_unanswered_goodbye_ends_with_the_teardowns_budget(
    autojump_clock: object,
) -> None:
    # The budget ends in 0.25 s: the goodbye gets that, not its second.
    assert await goodbye_took(trio.current_time() + 0.25) == 0.25
