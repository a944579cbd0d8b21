# A worker's announcement to its fleet: every stats interval it stores who it is (host, pid, the
# release it runs), what it claims and how busy it is, and as it ends it takes that back. Apart
# from the worker because only operators read it (the dashboard's workers), and its one tie to
# the worker is its lifetime.
from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable

import trio

from .._core.errors import DriverError
from .._core.logs import log_event
from .._core.records import WorkerPresence
from ..drivers.contract import Driver

# The goodbye is one short write, shielded so a cancelled worker still says it; bounded, so a
# database that stopped answering costs a teardown at most this long (the record then ages out),
# and never past the end of the teardown's budget (the process must be gone by then).
GOODBYE_WITHIN = 1.0

Describe = Callable[[float, float], WorkerPresence]  # (started_at, now) -> the announcement


async def announce_presence(
    driver: Driver, describe: Describe, every: float, goodbye_by: Callable[[], float]
) -> None:
    """Announce every ``every`` seconds until cancelled, then take the announcement back, by
    ``goodbye_by()`` (a trio time) at the latest.
    A failed announcement is logged and tried again at the next interval: it never stops the
    worker (the dashboard shows the worker as not seen, which is what happened)."""
    started_at = driver.now()
    worker_id = describe(started_at, started_at).worker_id
    try:
        while True:
            try:
                await driver.worker_seen(describe(started_at, driver.now()))
            except DriverError as exc:
                log_event("jobs.worker.presence-failed", logging.WARNING, error=str(exc))
            await trio.sleep(every)
    finally:
        deadline = min(trio.current_time() + GOODBYE_WITHIN, goodbye_by())
        with (
            trio.CancelScope(shield=True),
            trio.move_on_at(deadline),
            contextlib.suppress(DriverError),
        ):
            await driver.worker_gone(worker_id)
