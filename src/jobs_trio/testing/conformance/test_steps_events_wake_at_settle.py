# A send that lands between a waiting job's look for its event and the settle of its suspend:
# the job is still running then, so the send wakes nothing, and the settle must (rules.woken).
# Apart from test_steps_events.py because these are about that window and its mark alone.
from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import pytest

from jobs_trio._core.records import Claim, JobId, JobState, Suspend
from jobs_trio.driver import Driver, SettlesWithClaims
from jobs_trio.testing._clock import ManualClock

from .helpers import claim_one, enqueue_one

POLL = 3600.0  # the job's event_poll: how long a missed send would have left it asleep


async def _settle(driver: Driver, suspend: Suspend, path: str) -> Sequence[JobId]:
    """``suspend`` settled by ``settle``, or carried by a claim (PostgreSQL: one statement)."""
    if path == "settle":
        return await driver.settle([suspend])
    if not driver.capabilities.settles_with_claims:
        pytest.skip(f"{type(driver).__name__} settles and claims apart (no settle_and_claim)")
    # A claim of no job: only what the settle did is looked at here.
    both = cast(SettlesWithClaims, driver)
    applied, _ = await both.settle_and_claim([suspend], ["elsewhere"], 1, lease=30, worker_id="w")
    return applied


async def _waits_for(driver: Driver, claim: Claim, key: str, path: str) -> None:
    """The job of ``claim`` looks for its event (none yet) and suspends on it, as
    ``step.wait_for_event`` does, with an event of another key sent between the two."""
    look = await driver.look_for_event("shipped", key=key, since=None)
    assert look.found is None
    await driver.send_event("shipped", '{"order": 1}', key="order-1")
    suspend = Suspend(claim.lease, POLL, event="shipped", seen=look.seen)
    assert await _settle(driver, suspend, path) == [claim.job_id]


@pytest.mark.parametrize("path", ["settle", "settle_and_claim"])
async def test_an_event_sent_between_the_look_and_the_suspend_wakes_the_job(
    driver: Driver, manual_clock: ManualClock, path: str
) -> None:
    job_id = await enqueue_one(driver)
    claim = await claim_one(driver)
    look = await driver.look_for_event("shipped", key="order-7", since=None)
    assert look.found is None
    manual_clock.advance(1)
    # The job still runs: no job is suspended on the name for this send to wake.
    await driver.send_event("shipped", '{"order": 7}', key="order-7")
    manual_clock.advance(1)
    suspend = Suspend(claim.lease, POLL, event="shipped", seen=look.seen)
    assert await _settle(driver, suspend, path) == [job_id]
    record = await driver.get(job_id)
    assert record is not None
    assert (record.state, record.run_at, record.wait_event, record.attempts) == (
        JobState.READY,
        driver.now(),
        "shipped",
        0,
    )
    again = await claim_one(driver)
    assert again.job_id == job_id
    found = (await driver.look_for_event("shipped", key="order-7", since=None)).found
    assert found is not None and found.payload == '{"order": 7}'


async def test_an_event_the_look_saw_does_not_wake_the_job_at_its_suspend(
    driver: Driver, manual_clock: ManualClock
) -> None:
    await driver.send_event("shipped", '{"order": 1}', key="order-1")
    manual_clock.advance(1)
    job_id = await enqueue_one(driver)
    claim = await claim_one(driver)
    look = await driver.look_for_event("shipped", key="order-7", since=None)
    assert look.found is None
    await driver.settle([Suspend(claim.lease, POLL, event="shipped", seen=look.seen)])
    record = await driver.get(job_id)
    assert record is not None
    assert (record.state, record.run_at) == (JobState.SUSPENDED, driver.now() + POLL)
    assert await driver.claim(["default"], 1, lease=30, worker_id="w") == []


@pytest.mark.parametrize("path", ["settle", "settle_and_claim"])
async def test_a_job_woken_by_another_keys_event_looks_once_then_stays_suspended(
    driver: Driver, manual_clock: ManualClock, path: str
) -> None:
    job_id = await enqueue_one(driver)
    await _waits_for(driver, await claim_one(driver), "order-7", path)
    # Woken for an event it had not seen: one more look, which finds it is not its own...
    manual_clock.advance(1)
    claim = await claim_one(driver)
    assert claim.job_id == job_id
    look = await driver.look_for_event("shipped", key="order-7", since=None)
    assert look.found is None
    # ...and sleeps its whole poll: the event it saw never wakes it again.
    assert await _settle(driver, Suspend(claim.lease, POLL, "shipped", look.seen), path) == [job_id]
    record = await driver.get(job_id)
    assert record is not None
    assert (record.state, record.run_at) == (JobState.SUSPENDED, driver.now() + POLL)
    assert await driver.claim(["default"], 1, lease=30, worker_id="w") == []
