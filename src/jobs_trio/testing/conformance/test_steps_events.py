from __future__ import annotations

from jobs_trio._core.records import JobState, StepRecord, StepStatus, Suspend
from jobs_trio.driver import Driver
from jobs_trio.testing._clock import ManualClock

from .helpers import a_claim_taken_over, claim_one, enqueue_one


async def test_step_records_are_saved_and_loaded(driver: Driver) -> None:
    job_id = await enqueue_one(driver)
    claim = await claim_one(driver)
    step = StepRecord("charge", StepStatus.DONE, started_at=1.0, finished_at=2.0, result='"ok"')
    assert await driver.save_step(claim.lease, step)
    replaced = StepRecord("wait", StepStatus.SLEEPING, started_at=3.0, wake_at=10.0)
    assert await driver.save_step(claim.lease, replaced)
    done = StepRecord("wait", StepStatus.DONE, started_at=3.0, finished_at=10.0, result="null")
    assert await driver.save_step(claim.lease, done)
    loaded = {s.name: s for s in await driver.load_steps(job_id)}
    assert loaded == {"charge": step, "wait": done}


async def test_a_step_write_with_a_stale_token_is_refused(
    driver: Driver, manual_clock: ManualClock
) -> None:
    job_id, stale, _ = await a_claim_taken_over(driver, manual_clock)
    step = StepRecord("charge", StepStatus.DONE, started_at=1.0, finished_at=2.0, result="1")
    assert not await driver.save_step(stale.lease, step)
    assert await driver.load_steps(job_id) == []


async def test_an_event_wakes_a_job_suspended_on_it(
    driver: Driver, manual_clock: ManualClock
) -> None:
    job_id = await enqueue_one(driver)
    claim = await claim_one(driver)
    await driver.settle([Suspend(claim.lease, delay=3600, event="shipped")])
    assert await driver.claim(["default"], 1, lease=30, worker_id="w") == []
    await driver.send_event("other", "{}")
    assert await driver.claim(["default"], 1, lease=30, worker_id="w") == []
    manual_clock.advance(1)
    await driver.send_event("shipped", '{"order": 7}', key="order-7")
    record = await driver.get(job_id)
    assert record is not None and record.state is JobState.READY
    assert (await claim_one(driver)).job_id == job_id


async def test_look_for_event_finds_by_name_key_and_time(
    driver: Driver, manual_clock: ManualClock
) -> None:
    await driver.send_event("shipped", '{"n": 1}', key="a")
    manual_clock.advance(10)
    since = driver.now()
    await driver.send_event("shipped", '{"n": 2}', key="b")
    await driver.send_event("shipped", '{"n": 3}', key="a")
    first_a = (await driver.look_for_event("shipped", key="a", since=None)).found
    assert first_a is not None and first_a.payload == '{"n": 1}'
    late_a = (await driver.look_for_event("shipped", key="a", since=since)).found
    assert late_a is not None and late_a.payload == '{"n": 3}'
    any_late = (await driver.look_for_event("shipped", key=None, since=since)).found
    assert any_late is not None and any_late.payload == '{"n": 2}'
    assert (await driver.look_for_event("shipped", key="zzz", since=None)).found is None
