# An idle PostgreSQL worker runs a job whose own settle made it due soon (a step.sleep, a retry's
# backoff) when it is due, not when the lease its wait was planned on would have lapsed.
from __future__ import annotations

from typing import Any

import pytest
import trio

import jobs_trio
from jobs_trio import JobState, Registry
from jobs_trio.driver import Driver
from tests.helpers.worker_helpers import record

pytestmark = pytest.mark.postgres

# Long enough that a wait planned on the lease stands out against any loaded machine's delay.
LEASE = 30.0
# A step.sleep's second, and a loaded machine's margin; planned on the lease it took 30 s.
WITHIN = 12.0


async def _completed_within(driver: Driver, registry: Registry, job_id: str) -> float:
    async with jobs_trio.open_worker(driver, registry, concurrency=10, lease=LEASE):
        started = trio.current_time()
        with trio.fail_after(WITHIN):
            while (await record(driver, job_id)).state is not JobState.COMPLETED:
                await trio.sleep(0.05)
        return trio.current_time() - started


@pytest.mark.parametrize("how", ["step.sleep", "wait_for_event timeout", "retry backoff"])
async def test_a_job_due_by_its_own_settle_runs_when_due_on_an_idle_worker(
    pg_driver: Driver, how: str
) -> None:
    driver = pg_driver
    registry = Registry()
    tries = 0

    @registry.job("due.soon", attempts=2, backoff=jobs_trio.Backoff(base=1.0, jitter=0))
    async def soon(ctx: jobs_trio.JobContext, payload: Any) -> str:
        nonlocal tries
        tries += 1
        if how == "step.sleep":
            await ctx.step.sleep("nap", 1.0)
        elif how == "wait_for_event timeout":
            try:
                await ctx.step.wait_for_event("w", "never.sent", timeout=1.0)
            except jobs_trio.EventTimedOut:
                return "timed out"
        elif tries == 1:
            raise RuntimeError("once")
        return "done"

    job_id = await soon.enqueue(driver)
    took = await _completed_within(driver, registry, job_id)
    assert took >= 1.0  # it did wait for its second
