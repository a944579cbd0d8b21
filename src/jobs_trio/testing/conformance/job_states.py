# Every state a job can be in, each reached through the driver's own operations, for the
# per-state tables: one builder, so every table walks the same states the same way.
from __future__ import annotations

import attrs

from jobs_trio._core.records import (
    Complete,
    DeadLetter,
    JobRecord,
    Lease,
    Park,
    Retry,
    Settlement,
    Suspend,
)
from jobs_trio.driver import Driver
from jobs_trio.drivers._rules import SUSPECT_AT
from jobs_trio.testing._clock import ManualClock

from .helpers import claim_one, new_job

LEASE = 30.0  # every claim here; a running job has lapsed once the clock passes it
WAIT = 60.0  # every delay here: a delayed, retrying or sleeping job is due after it
EVENT = "paid"

STATES = (
    "ready-due",
    "ready-delayed",
    "ready-retry-delay",
    "running",
    "running-cancel-requested",
    "suspended-time",
    "suspended-event",
    "parked",
    "completed",
    "dead",
    "dead-lapsed-cancel-requested",
    "cancelled",
)
RUNNING = frozenset({"running", "running-cancel-requested"})


@attrs.frozen
class Placed:
    """A job in one state. ``lease`` is its current lease when it runs; otherwise the lease of
    its last run (or one it never had): stale either way, which is what the tables need."""

    job_id: str
    lease: Lease
    record: JobRecord


async def place(
    driver: Driver, clock: ManualClock, state: str, *, key: str | None = None
) -> Placed:
    """A fresh job, in ``state``, with five attempts (a lapse never exhausts it; one for the
    state that is dead by a lapse). The clock
    moves a second between steps, so no two of a record's times are equal by accident."""
    lapses = state == "dead-lapsed-cancel-requested"
    job = new_job(
        "t.state",
        attempts=1 if lapses else 5,
        key=key,
        delay=WAIT if state == "ready-delayed" else 0,
    )
    [answer] = await driver.enqueue([job])
    assert answer.created
    job_id = answer.job_id
    lease = Lease(job_id, "0" * 24)
    clock.advance(1)
    if state not in ("ready-due", "ready-delayed", "cancelled"):
        claim = await claim_one(driver, lease=LEASE)
        assert claim.job_id == job_id
        lease = claim.lease
        clock.advance(1)
        endings: dict[str, Settlement] = {
            "ready-retry-delay": Retry(lease, WAIT, "boom"),
            "suspended-time": Suspend(lease, WAIT),
            "suspended-event": Suspend(lease, 3600.0, event=EVENT),
            "parked": Park(lease, "unknown name"),
            "completed": Complete(lease, '"done"'),
            "dead": DeadLetter(lease, "fatal"),
        }
        ending = endings.get(state)
        if ending is not None:
            assert await driver.settle([ending]) == [job_id]
    if state in ("cancelled", "running-cancel-requested"):
        await driver.cancel(job_id)
    if lapses and not driver.capabilities.claims_alone:
        # Its one attempt lapsed with the cancel pending: buried by the claim that finds it.
        await driver.cancel(job_id)
        clock.advance(LEASE + 1)
        assert await driver.claim(["default"], 5, lease=LEASE, worker_id="w1") == []
    elif lapses:
        # A suspect (orphaned twice) whose worker died while it ran alone, with the cancel
        # pending: the claim that finds it dead-letters it by the orphan rule (X_KILLED_WORKER),
        # and the flag stays on the dead record (the claim does not clear it).
        for _ in range(SUSPECT_AT):
            clock.advance(LEASE + 1)
            if not await driver.claim(["default"], 5, lease=LEASE, worker_id="w1"):
                await driver.claim(["default"], 5, lease=LEASE, worker_id="w1")
        [claim] = await driver.claim(["default"], 5, lease=LEASE, worker_id="w1", alone=True)
        lease = claim.lease
        await driver.cancel(job_id)
        clock.advance(LEASE + 1)
        assert await driver.claim(["default"], 5, lease=LEASE, worker_id="w1") == []
    clock.advance(1)
    record = await driver.get(job_id)
    assert record is not None
    return Placed(job_id, lease, record)
