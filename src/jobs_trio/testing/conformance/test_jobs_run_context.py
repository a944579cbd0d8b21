# A run's context (NewJob.context: JSON text, checked at the boundary) on every driver: stored
# with the job, handed to the run by every claim, and carried by the outbox and cron fires.
from __future__ import annotations

import attrs

from jobs_trio._core.records import TaskAdvance, TaskFire
from jobs_trio.driver import Driver
from jobs_trio.testing._clock import ManualClock

from .helpers import claim_one, new_job, relay_write, take_rows

# What run_context.stored_context writes: the application's names and the W3C trace context,
# sorted. Non-ASCII on purpose: every driver must hand the text back as written.
CONTEXT = '{"request":"r-42","tenant":"t1 – Zürich","traceparent":"00-0af7-b7ad-01"}'


async def test_a_context_is_stored_with_its_job_and_handed_to_every_claim(
    driver: Driver, manual_clock: ManualClock
) -> None:
    job = attrs.evolve(new_job(attempts=3), context=CONTEXT)
    plain = new_job(queue="plain")
    await driver.enqueue([job, plain])
    stored = await driver.get(job.job_id)
    assert stored is not None and stored.context == CONTEXT
    assert stored.to_json()["context"] == CONTEXT
    first = await claim_one(driver, lease=10.0)
    assert (first.job_id, first.context) == (job.job_id, CONTEXT)
    # A lapsed lease's re-claim is a run of the same enqueue: the same context.
    manual_clock.advance(10.0)
    again = await claim_one(driver)
    assert again.context == CONTEXT
    # Orphaned, its attempt not counted, where the driver has the rule (rules.orphaning).
    assert again.attempt == (1 if driver.capabilities.claims_alone else 2)
    # A job enqueued without one reads back None, on the record and on the claim.
    assert (await claim_one(driver, queue="plain")).context is None
    assert (await driver.get(plain.job_id)).context is None  # type: ignore[union-attr]


async def test_a_context_goes_through_the_outbox_and_the_relays_enqueue(
    driver: Driver,
) -> None:
    job = attrs.evolve(new_job(), context=CONTEXT)
    await driver.outbox_write([job, new_job(queue="plain")])
    taken = (await take_rows(driver, 10, lease=30.0, relay_id="r1")).jobs
    assert [t.context for t in taken] == [CONTEXT, None]
    await relay_write(driver, taken, source="s")
    claim = await claim_one(driver)
    assert (claim.job_id, claim.context) == (job.job_id, CONTEXT)


async def test_a_cron_fire_stores_its_jobs_context(driver: Driver) -> None:
    job = attrs.evolve(new_job("reports.daily", queue="reports"), context=CONTEXT)
    advance = TaskAdvance("reports.daily", None, 100.0, (TaskFire(100.0, job),))
    assert await driver.advance_task(advance)
    claim = await claim_one(driver, queue="reports")
    assert (claim.job_id, claim.context) == (job.job_id, CONTEXT)
