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
    """Read the paused queues, tell ``heard`` which of ``queues`` are paused, then wait for a
    change (``every`` seconds at most between looks, ``retry_after`` after a failed one) and
    tell it again whenever that changes. Started once the first look is answered (or has
    failed): a worker then starts nothing of a queue it can know is paused."""
    ours = frozenset(queues)
    # Every paused queue the last look saw, the worker's or not: the watch waits for a change
    # of THAT (a pause of a queue this worker never claims is a change too, once).
    seen: frozenset[str] | None = None
    told: frozenset[str] = frozenset()
    started = False
    while True:
        try:
            if seen is None:
                pauses = await driver.queue_pauses()
            else:
                pauses = await driver.wait_for_pauses(seen, every)
        except DriverError as exc:
            log_event("jobs.worker.pauses-failed", logging.WARNING, error=str(exc))
            if not started:
                task_status.started()
                started = True
            await trio.sleep(retry_after)
            continue
        seen = frozenset(p.queue for p in pauses)
        paused = seen & ours
        if paused != told or not started:
            told = paused
            heard(paused)
        if not started:
            task_status.started()
            started = True
