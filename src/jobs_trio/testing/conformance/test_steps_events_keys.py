# A send wakes only the waiters of its name that wait for its key (wait_for_event's match) or
# for any key: before, every send of a name woke every job waiting on it, each to look and sleep
# again, so a fleet of workflows keyed by order id woke whole for each order's event.
from __future__ import annotations

from jobs_trio._core.records import JobId, JobState, Suspend
from jobs_trio.driver import Driver
from jobs_trio.testing._clock import ManualClock

from .helpers import claim_one, enqueue_one

POLL = 3600.0


async def _suspended_on(driver: Driver, match: str | None, *, seen: str | None = None) -> JobId:
    job_id = await enqueue_one(driver)
    claim = await claim_one(driver)
    suspend = Suspend(claim.lease, POLL, event="order.paid", seen=seen, match=match)
    assert await driver.settle([suspend]) == [job_id]
    return job_id


async def _state(driver: Driver, job_id: JobId) -> JobState:
    record = await driver.get(job_id)
    assert record is not None
    return record.state


async def test_a_send_wakes_the_waiters_of_its_key_and_of_any_key_only(
    driver: Driver, manual_clock: ManualClock
) -> None:
    for_a = await _suspended_on(driver, "A")
    for_b = await _suspended_on(driver, "B")
    for_any = await _suspended_on(driver, None)
    record = await driver.get(for_a)
    assert record is not None and (record.wait_event, record.wait_key) == ("order.paid", "A")
    manual_clock.advance(1)
    await driver.send_event("order.paid", '{"order": "A"}', key="A")
    states = [await _state(driver, job_id) for job_id in (for_a, for_b, for_any)]
    assert states == [JobState.READY, JobState.SUSPENDED, JobState.READY]
    await driver.send_event("order.paid", "null", key=None)  # a keyless send: any-key waiters
    assert await _state(driver, for_b) is JobState.SUSPENDED
    await driver.send_event("order.paid", '{"order": "B"}', key="B")
    assert await _state(driver, for_b) is JobState.READY


async def test_a_claim_forgets_the_key_its_job_waited_for(
    driver: Driver, manual_clock: ManualClock
) -> None:
    job_id = await _suspended_on(driver, "A")
    manual_clock.advance(POLL)  # its poll comes due: claimed again, to look
    claim = await claim_one(driver)
    assert claim.job_id == job_id
    record = await driver.get(job_id)
    assert record is not None and (record.wait_event, record.wait_key) == (None, None)


async def test_an_event_of_another_key_past_the_looks_mark_leaves_the_suspend_asleep(
    driver: Driver, manual_clock: ManualClock
) -> None:
    look = await driver.look_for_event("order.paid", key="A", since=None)
    await driver.send_event("order.paid", '{"order": "B"}', key="B")  # after the look, not ours
    job_id = await _suspended_on(driver, "A", seen=look.seen)
    assert await _state(driver, job_id) is JobState.SUSPENDED
