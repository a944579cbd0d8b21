from __future__ import annotations

import pytest

from jobs_trio._core.errors import InvalidTransition, JobNotFound
from jobs_trio._core.records import Complete, DeadLetter, JobState
from jobs_trio.driver import Driver
from jobs_trio.testing._clock import ManualClock

from .helpers import claim_one, enqueue_one, new_job


async def test_cancel_a_ready_job(driver: Driver) -> None:
    job_id = await enqueue_one(driver)
    record = await driver.cancel(job_id)
    assert record.state is JobState.CANCELLED
    assert await driver.claim(["default"], 1, lease=30, worker_id="w") == []


async def test_cancel_a_running_job_is_reported_at_renewal(driver: Driver) -> None:
    job_id = await enqueue_one(driver)
    claim = await claim_one(driver)
    record = await driver.cancel(job_id)
    assert record.state is JobState.RUNNING and record.cancel_requested
    result = await driver.renew([claim.lease], lease=30)
    assert result.held == {claim.token} and result.cancel_requested == {claim.token}


async def test_cancel_a_finished_job_is_refused(driver: Driver) -> None:
    job_id = await enqueue_one(driver)
    claim = await claim_one(driver)
    await driver.settle([Complete(claim.lease)])
    with pytest.raises(InvalidTransition):
        await driver.cancel(job_id)


async def test_unknown_id_is_not_found(driver: Driver) -> None:
    assert await driver.get("nope") is None
    with pytest.raises(JobNotFound):
        await driver.retry("nope")
    with pytest.raises(JobNotFound):
        await driver.cancel("nope")


async def test_retry_a_dead_job_resets_attempts(driver: Driver) -> None:
    job_id = await enqueue_one(driver, attempts=1)
    claim = await claim_one(driver)
    await driver.settle([DeadLetter(claim.lease, error="bad")])
    record = await driver.retry(job_id)
    assert record.state is JobState.READY and record.attempts == 0
    assert (await claim_one(driver)).job_id == job_id


async def test_retry_a_ready_job_is_refused(driver: Driver) -> None:
    job_id = await enqueue_one(driver)
    with pytest.raises(InvalidTransition):
        await driver.retry(job_id)


async def test_list_filters_by_state_and_queue(driver: Driver) -> None:
    await driver.enqueue([new_job(queue="a"), new_job(queue="a"), new_job(queue="b")])
    await claim_one(driver, queue="a")
    assert len(await driver.list_jobs(queue="a")) == 2
    assert len(await driver.list_jobs(state=JobState.RUNNING)) == 1
    assert len(await driver.list_jobs(state=JobState.READY, queue="b")) == 1
    assert len(await driver.list_jobs(limit=1)) == 1


async def test_list_filters_by_the_whole_name(driver: Driver) -> None:
    mail = [new_job("mail.send", queue="a"), new_job("mail.send", queue="b")]
    await driver.enqueue([*mail, new_job("mail.sender"), new_job("reports.build", queue="a")])
    listed = await driver.list_jobs(name="mail.send")
    assert {r.id for r in listed} == {job.job_id for job in mail}  # not mail.sender: no prefix
    [one] = await driver.list_jobs(name="mail.send", queue="b")
    assert one.id == mail[1].job_id
    assert await driver.list_jobs(name="mail.send", state=JobState.DEAD) == []
    assert await driver.list_jobs(name="mail") == []


async def test_list_filters_by_the_time_of_the_last_change(
    driver: Driver, manual_clock: ManualClock
) -> None:
    old = await enqueue_one(driver)
    manual_clock.advance(60)
    fresh = await enqueue_one(driver)
    before = manual_clock.now
    assert [r.id for r in await driver.list_jobs(changed_before=before)] == [old]
    assert [r.id for r in await driver.list_jobs(changed_before=before + 1)] == [fresh, old]
    manual_clock.advance(1)
    await driver.cancel(old)  # a change: now younger than the other
    assert await driver.list_jobs(changed_before=before + 1) == [await driver.get(fresh)]


async def test_stats_per_queue(driver: Driver, manual_clock: ManualClock) -> None:
    await driver.enqueue([new_job(queue="a") for _ in range(3)] + [new_job(queue="b", delay=60)])
    manual_clock.advance(5)
    claim = await claim_one(driver, queue="a")
    await driver.settle([DeadLetter(claim.lease, error="x")])
    stats = {s.queue: s for s in await driver.stats()}
    assert stats["a"].depth == {"ready": 2, "dead": 1}
    assert stats["a"].dead == 1 and stats["a"].due == 2
    assert stats["a"].oldest_ready_age == pytest.approx(5.0)
    assert stats["b"].depth == {"ready": 1} and stats["b"].due == 0
    assert stats["b"].oldest_ready_age is None


@pytest.mark.parametrize("limit", [-1, 0])
async def test_a_limit_below_one_lists_nothing(driver: Driver, limit: int) -> None:
    # The drivers disagreed on a negative limit (memory listed all but the last job; SQL's
    # LIMIT clamped to zero): every driver answers nothing now.
    for _ in range(3):
        await enqueue_one(driver)
    assert await driver.list_jobs(limit=limit) == []
