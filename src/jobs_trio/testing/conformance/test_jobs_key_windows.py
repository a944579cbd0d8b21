# Unique keys with a window (issue 47): a job of the key created within the window holds it
# also once finished, in the states the window covers (completed by default; dead and cancelled
# when asked), and a live job holds it whatever its age; past the window the key is free.
from __future__ import annotations

import attrs

from jobs_trio._core.records import CancelJob, Complete, DeadLetter, NewJob, Settlement
from jobs_trio.driver import Driver
from jobs_trio.testing._clock import ManualClock

from .helpers import claim_one, new_job

DAY = 86400.0


def windowed(key: str, window: float = DAY, states: tuple[str, ...] = ("completed",)) -> NewJob:
    return attrs.evolve(new_job(key=key), unique_for=window, unique_states=states)


async def _finished(driver: Driver, job: NewJob, how: str) -> str:
    """``job`` enqueued, claimed and ended ``how`` (completed, dead or cancelled)."""
    [answer] = await driver.enqueue([job])
    assert answer.created
    claim = await claim_one(driver)
    ending: Settlement
    if how == "completed":
        ending = Complete(claim.lease, result="null")
    elif how == "dead":
        ending = DeadLetter(claim.lease, error="boom")
    else:
        ending = CancelJob(claim.lease, error="stopped")
    assert await driver.settle([ending]) == [answer.job_id]
    return answer.job_id


async def test_a_completed_job_holds_its_key_for_the_window(
    driver: Driver, manual_clock: ManualClock
) -> None:
    first = await _finished(driver, windowed("welcome:42"), "completed")
    manual_clock.advance(DAY - 1)
    [again] = await driver.enqueue([windowed("welcome:42")])
    assert not again.created and again.job_id == first
    # Without a window the same key is free: only a live job holds it.
    [plain] = await driver.enqueue([new_job(key="welcome:42")])
    assert plain.created
    manual_clock.advance(2)  # the first job was created a day and a second ago
    [other] = await driver.enqueue([windowed("welcome:43")])
    assert other.created


async def test_past_the_window_the_key_is_free(driver: Driver, manual_clock: ManualClock) -> None:
    await _finished(driver, windowed("k", window=60), "completed")
    manual_clock.advance(61)
    [later] = await driver.enqueue([windowed("k", window=60)])
    assert later.created
    # ... and the new job holds it in turn, for its own window.
    [held] = await driver.enqueue([windowed("k", window=60)])
    assert not held.created and held.job_id == later.job_id


async def test_the_newest_holder_in_the_window_is_answered(
    driver: Driver, manual_clock: ManualClock
) -> None:
    await _finished(driver, new_job(key="k"), "completed")
    manual_clock.advance(10)
    newer = await _finished(driver, new_job(key="k"), "completed")
    manual_clock.advance(10)
    [answer] = await driver.enqueue([windowed("k", window=60)])
    assert not answer.created and answer.job_id == newer


async def test_dead_and_cancelled_jobs_hold_the_key_only_when_the_window_covers_them(
    driver: Driver, manual_clock: ManualClock
) -> None:
    dead = await _finished(driver, windowed("d"), "dead")
    cancelled = await _finished(driver, windowed("c"), "cancelled")
    manual_clock.advance(1)
    [retry_d] = await driver.enqueue([windowed("d")])  # default: completed only
    [retry_c] = await driver.enqueue([windowed("c")])
    assert retry_d.created and retry_c.created
    assert await driver.settle(
        [CancelJob((await claim_one(driver)).lease, error="x") for _ in range(2)]
    )
    [held_d] = await driver.enqueue([windowed("d", states=("dead", "cancelled"))])
    assert not held_d.created
    [held_c] = await driver.enqueue([windowed("c", states=("cancelled",))])
    assert not held_c.created and held_c.job_id != cancelled
    [not_completed] = await driver.enqueue([windowed("d", states=("completed",))])
    assert not_completed.created and dead != not_completed.job_id


async def test_a_live_job_holds_its_key_whatever_its_age(
    driver: Driver, manual_clock: ManualClock
) -> None:
    [first] = await driver.enqueue([new_job(key="k")])
    manual_clock.advance(10 * DAY)
    [again] = await driver.enqueue([windowed("k", window=60)])
    assert not again.created and again.job_id == first.job_id


async def test_a_batch_with_windows_answers_in_order(
    driver: Driver, manual_clock: ManualClock
) -> None:
    held = await _finished(driver, windowed("a"), "completed")
    answers = await driver.enqueue(
        [windowed("a"), windowed("b"), new_job(), windowed("b"), new_job(key="a")]
    )
    created = [a.created for a in answers]
    assert created == [False, True, True, False, True]
    assert answers[0].job_id == held and answers[3].job_id == answers[1].job_id
    assert len(await driver.list_jobs()) == 4
