# Lease renewal: every held run's lease extended in ONE driver call per interval; a run whose
# lease is gone is cancelled `lease-lost`. Apart because it is the only path a lost lease takes.
from __future__ import annotations

import logging

import trio

from .drain import Drain
from .driver import Driver
from .errors import DriverError
from .logs import log_event
from .run_scope import CANCELLED, LEASE_LOST, RunScope


async def renew_held(driver: Driver, runs: list[RunScope], lease: float) -> None:
    """One renewal round for ``runs``: extend, or cancel the ones lost or operator-cancelled."""
    if not runs:
        return
    sent_at = trio.current_time()
    try:
        result = await driver.renew([r.claim.lease for r in runs], lease=lease)
    except DriverError as exc:
        log_event("jobs.lease.renew-failed", logging.WARNING, runs=len(runs), error=str(exc))
        now = trio.current_time()
        for run in runs:
            # Past our own view of the lease another worker may already have claimed the
            # job: stop rather than run two copies at once.
            if now >= run.lease_deadline:
                run.cancel(LEASE_LOST)
        return
    for run in runs:
        if run.job_id not in result.held:
            log_event("jobs.lease.lost", logging.WARNING, job_id=run.job_id, job=run.claim.name)
            run.cancel(LEASE_LOST)
        else:
            run.lease_deadline = sent_at + lease
            if run.job_id in result.cancel_requested:
                run.cancel(CANCELLED)


async def renew_leases(
    driver: Driver,
    drain: Drain,
    *,
    lease: float,
    interval: float,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    task_status.started()
    while True:
        await trio.sleep(interval)
        await renew_held(driver, drain.held, lease)
