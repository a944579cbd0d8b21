# A worker's watch on paused queues: it hears a pause or a resume of the queues the worker claims
# from (Driver.wait_for_pauses), tells the worker, which hands back at once the jobs of a paused
# queue it holds unstarted, and then confirms what it heard (Driver.pauses_heard), which the
# pause's caller waits for. Apart from the claim loop: a pause must reach the jobs a worker holds
# whether or not it is claiming, and the database already keeps claims off it.
from __future__ import annotations

import logging
from collections.abc import Callable, Collection

import trio

from .._core.errors import DriverError
from .._core.logs import log_event
from ..drivers.contract import Driver

# Told the worker's queues that are paused, each time that set changes.
Heard = Callable[[frozenset[str]], None]


async def watch_pauses(
    driver: Driver,
    worker_id: str,
    queues: Collection[str],
    heard: Heard,
    *,
    every: float,
    retry_after: float,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Tell ``heard`` which of ``queues`` are paused whenever that changes, starting from none
    (the database gives no claim a job of a paused queue, so until the first look answers the
    worker only holds jobs claimed before the pause), and confirm each look that has one of them
    paused, or changed them, once ``heard`` has acted on it. Looks at most ``every`` seconds
    apart, ``retry_after`` after a failed look or confirmation. An idle worker none of whose
    queues is paused costs one look at start, then a wait (the driver's wake-up)."""
    ours = frozenset(queues)
    seen: int | None = None  # the epoch of the last look (PauseLook.epoch)
    told: frozenset[str] = frozenset()
    unconfirmed = False
    task_status.started()
    while True:
        try:
            if not unconfirmed:
                look = await driver.wait_for_pauses(seen, every)
                if look.epoch == seen:
                    continue
                seen = look.epoch
                paused = frozenset(p.queue for p in look.pauses) & ours
                # Synchronous, before the confirmation: the held jobs of a newly paused queue
                # are cancelled now and a claim answered from here starts nothing of it, so a
                # confirmation written is a promise kept (docs/model.md, "Pausing a queue").
                unconfirmed = bool(paused) or paused != told
                if paused != told:
                    told = paused
                    heard(paused)
            if unconfirmed and seen is not None:
                await driver.pauses_heard(worker_id, seen)
                unconfirmed = False
        except DriverError as exc:
            log_event("jobs.worker.pauses-failed", logging.WARNING, error=str(exc))
            await trio.sleep(retry_after)
