# A worker's watch on paused queues: it hears a pause or a resume of the queues the worker claims
# from (Driver.wait_for_pauses) and tells the worker, which hands back at once the jobs of a
# paused queue it holds unstarted. Apart from the claim loop: a pause must reach the jobs a
# worker holds whether or not it is claiming, and the database already keeps claims off it.
from __future__ import annotations

import logging
from collections.abc import Callable, Collection

import trio

from .._core.errors import DriverError
from .._core.logs import log_event
from ..drivers.contract import Driver

# Told the worker's queues that are paused, each time that set changes (and once at start).
Heard = Callable[[frozenset[str]], None]


async def watch_pauses(
    driver: Driver,
    queues: Collection[str],
    heard: Heard,
    *,
    every: float,
    retry_after: float,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Tell ``heard`` which of ``queues`` are paused whenever that changes, starting from none
    (the database gives no claim a job of a paused queue, so until the first look answers the
    worker only holds nothing of one). Looks at most ``every`` seconds apart, ``retry_after``
    after a failed look. An idle worker's watch costs one look at start, then a wait (the
    driver's wake-up)."""
    ours = frozenset(queues)
    # Every paused queue the last look saw, the worker's or not: the watch waits for a change
    # of THAT (a pause of a queue this worker never claims is a change too, once).
    seen: frozenset[str] = frozenset()
    told: frozenset[str] = frozenset()
    task_status.started()
    while True:
        try:
            pauses = await driver.wait_for_pauses(seen, every)
        except DriverError as exc:
            log_event("jobs.worker.pauses-failed", logging.WARNING, error=str(exc))
            await trio.sleep(retry_after)
            continue
        seen = frozenset(p.queue for p in pauses)
        if seen & ours != told:
            told = seen & ours
            heard(told)
