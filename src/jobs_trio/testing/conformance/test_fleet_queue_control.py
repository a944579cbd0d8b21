# Queue control (issue 46): a paused queue gives no claim anything, due or lapsed, and is no work
# for a waiter until it is resumed; the pause is durable, listed and in the stats; the watch on
# pauses hears them. An operator's delete of a job that is not running, and "run now" of a ready
# job whose time has not come.
from __future__ import annotations

from typing import cast

import pytest
import trio

from jobs_trio._core.errors import InvalidTransition, JobNotFound
from jobs_trio._core.records import (
    AttemptNote,
    Complete,
    JobState,
    PauseHolder,
    PauseLook,
    Retry,
    StepRecord,
    StepStatus,
)
from jobs_trio.driver import Driver, SettlesWithClaims
from jobs_trio.drivers._rules import FORGET_WORKERS_AFTER
from jobs_trio.testing._clock import ManualClock

from .helpers import a_waiting_watch, a_waiting_worker, claim_one, enqueue_one, new_job
from .job_states import place
from .test_fleet_limits import limited

# How long a waiter is watched to show it did NOT return: it would return at once (a due job is
# work), so a short watch is enough, on any machine.
STILL_WAITING = 0.3


async def test_a_paused_queue_gives_no_claim_anything_until_resumed(
    driver: Driver, manual_clock: ManualClock
) -> None:
    paused = await enqueue_one(driver, queue="a")
    other = await enqueue_one(driver, queue="b")
    pause = await driver.pause_queue("a", by="ops@box")
    assert (pause.queue, pause.paused_at, pause.by) == ("a", manual_clock.now, "ops@box")
    claims = await driver.claim(["a", "b"], {"a": 5, "b": 5}, lease=30, worker_id="w")
    assert [c.job_id for c in claims] == [other]  # the other queue runs on
    assert await driver.claim(["a"], 5, lease=30, worker_id="w") == []
    record = await driver.get(paused)
    assert record is not None and (record.state, record.attempts) == (JobState.READY, 0)
    assert await driver.resume_queue("a") is True
    assert [c.job_id for c in await driver.claim(["a"], 5, lease=30, worker_id="w")] == [paused]


async def test_a_paused_queues_lapsed_jobs_wait_for_the_resume(
    driver: Driver, manual_clock: ManualClock
) -> None:
    job_id = await enqueue_one(driver, queue="a")
    await claim_one(driver, queue="a", lease=10)
    await driver.pause_queue("a")
    manual_clock.advance(11)  # its worker died: a rescue would start it again
    assert await driver.claim(["a"], 5, lease=30, worker_id="w2") == []
    await driver.resume_queue("a")
    [again] = await driver.claim(["a"], 5, lease=30, worker_id="w2")
    # Orphaned at the resume's claim, not charged (rules.orphaning), where the driver has it.
    assert (again.job_id, again.attempt) == (job_id, 1 if driver.capabilities.claims_alone else 2)


async def test_a_paused_queues_limited_jobs_are_not_claimed(driver: Driver) -> None:
    [answer] = await driver.enqueue([limited(slots=1)])
    await driver.pause_queue("default")
    assert await driver.claim(["default"], 5, lease=30, worker_id="w") == []
    await driver.resume_queue("default")
    [claim] = await driver.claim(["default"], 5, lease=30, worker_id="w")
    assert claim.job_id == answer.job_id


async def test_a_claim_carrying_settlements_takes_nothing_of_a_paused_queue(
    driver: Driver, manual_clock: ManualClock
) -> None:
    if not driver.capabilities.settles_with_claims:
        pytest.skip(f"{type(driver).__name__} settles and claims apart (no settle_and_claim)")
    both = cast(SettlesWithClaims, driver)
    first = await enqueue_one(driver, queue="a")
    manual_clock.advance(1)  # claim order: by run-at
    waiting = await enqueue_one(driver, queue="a")
    claim = await claim_one(driver, queue="a")
    await driver.pause_queue("a")
    # The settle still applies (the run was under way before the pause); the claim takes none.
    applied, claims = await both.settle_and_claim(
        [Complete(claim.lease)], ["a"], 5, lease=30, worker_id="w"
    )
    assert (list(applied), list(claims)) == ([first], [])
    # A retry without delay makes its job due at once: not this claim's either.
    await driver.resume_queue("a")
    [again] = await driver.claim(["a"], 1, lease=30, worker_id="w")
    assert again.job_id == waiting
    await driver.pause_queue("a")
    applied, claims = await both.settle_and_claim(
        [Retry(again.lease, delay=0, error="again")], ["a"], 5, lease=30, worker_id="w"
    )
    assert (list(applied), list(claims)) == ([waiting], [])


async def test_pausing_is_durable_listed_and_idempotent(
    driver: Driver, manual_clock: ManualClock
) -> None:
    first = await driver.pause_queue("b", by="alice")
    manual_clock.advance(5)
    again = await driver.pause_queue("b", by="bob")
    assert again == first  # the pause on record, unchanged
    await driver.pause_queue("a")
    assert [(p.queue, p.by) for p in await driver.queue_pauses()] == [("a", None), ("b", "alice")]
    assert await driver.resume_queue("b") is True
    assert await driver.resume_queue("b") is False
    assert await driver.resume_queue("never-paused") is False
    assert [p.queue for p in await driver.queue_pauses()] == ["a"]


async def test_stats_show_a_paused_queue_even_without_jobs(driver: Driver) -> None:
    await driver.enqueue([new_job(queue="a"), new_job(queue="b")])
    await driver.pause_queue("a")
    await driver.pause_queue("empty")
    stats = {s.queue: s for s in await driver.stats()}
    assert {q: s.paused for q, s in stats.items()} == {"a": True, "b": False, "empty": True}
    assert stats["a"].depth == {"ready": 1} and stats["a"].due == 1
    assert stats["empty"].depth == {}
    observed = {s.queue: s.paused for s in await driver.fleet_stats("w", 0.0)}
    assert observed == {"a": True, "b": False, "empty": True}


async def test_a_paused_queues_due_jobs_are_no_work_and_its_resume_wakes_a_waiter(
    driver: Driver,
) -> None:
    await enqueue_one(driver, queue="a")
    await driver.pause_queue("a")
    with trio.move_on_after(STILL_WAITING) as watch:
        await driver.wait_for_work(["a"], timeout=30)
    assert watch.cancelled_caught, "a paused queue's due job woke the waiter"
    async with a_waiting_worker(driver, ("a",)):
        await driver.resume_queue("a")


async def test_the_watch_on_pauses_hears_a_pause_and_a_resume(driver: Driver) -> None:
    # Answered at once when asked for no epoch, or for one that is not the current one.
    first = await driver.wait_for_pauses(None, timeout=30)
    assert first.pauses == ()
    assert await driver.wait_for_pauses(first.epoch + 7, timeout=30) == first
    # Answered after its timeout when nothing changes.
    with trio.fail_after(10):
        assert await driver.wait_for_pauses(first.epoch, timeout=STILL_WAITING) == first
    async with a_waiting_watch(driver, first.epoch) as heard:
        pause = await driver.pause_queue("a")
    assert heard.value == PauseLook(pause.epoch, (pause,))
    assert pause.epoch > first.epoch
    async with a_waiting_watch(driver, pause.epoch) as heard:
        await driver.resume_queue("a")
    assert isinstance(heard.value, PauseLook) and heard.value.pauses == ()
    assert heard.value.epoch > pause.epoch


async def test_each_pause_and_resume_counts_one_epoch_in_order(driver: Driver) -> None:
    start = (await driver.wait_for_pauses(None, timeout=0)).epoch
    a = await driver.pause_queue("a")
    assert a.epoch == start + 1
    assert await driver.pause_queue("a", by="again") == a  # no change, no epoch
    b = await driver.pause_queue("b")
    assert b.epoch == start + 2
    assert await driver.resume_queue("a") is True
    assert await driver.resume_queue("a") is False  # no change, no epoch
    look = await driver.wait_for_pauses(None, timeout=0)
    assert look == PauseLook(start + 3, (b,))
    assert list(await driver.queue_pauses()) == [b]
    again = await driver.pause_queue("a")
    assert again.epoch == start + 4  # a new pause of the queue: a new epoch


async def test_the_holders_of_a_queue_and_the_epochs_they_confirmed(
    driver: Driver, manual_clock: ManualClock
) -> None:
    for _ in range(3):
        await enqueue_one(driver, queue="a")
    await enqueue_one(driver, queue="b")
    assert await driver.pause_holders("a") == []
    first = await driver.claim(["a"], 2, lease=30, worker_id="w1")
    manual_clock.advance(1)
    [second] = await driver.claim(["a"], 1, lease=60, worker_id="w2")
    await driver.claim(["b"], 1, lease=30, worker_id="w3")  # another queue's holder
    holders = await driver.pause_holders("a")
    assert holders == [
        PauseHolder("w1", 2, max(c.lease_until for c in first), None),
        PauseHolder("w2", 1, second.lease_until, None),
    ]
    pause = await driver.pause_queue("a")
    await driver.pauses_heard("w1", pause.epoch)
    await driver.pauses_heard("w3", pause.epoch)
    assert [(h.worker_id, h.heard) for h in await driver.pause_holders("a")] == [
        ("w1", pause.epoch),
        ("w2", None),
    ]
    # A later confirmation replaces the earlier; a holder whose jobs ended is none.
    await driver.pauses_heard("w1", pause.epoch + 1)
    assert await driver.settle([Complete(second.lease)]) == [second.job_id]
    assert [(h.worker_id, h.jobs, h.heard) for h in await driver.pause_holders("a")] == [
        ("w1", 2, pause.epoch + 1)
    ]
    # The confirmations of a worker silent for FORGET_WORKERS_AFTER are forgotten.
    manual_clock.advance(FORGET_WORKERS_AFTER + 1)
    await driver.pauses_heard("w4", pause.epoch)
    assert [(h.worker_id, h.heard) for h in await driver.pause_holders("a")] == [("w1", None)]


async def test_delete_removes_a_job_with_its_steps_and_history_and_frees_its_key(
    driver: Driver,
) -> None:
    job_id = await enqueue_one(driver, key="k1")
    claim = await claim_one(driver)
    step = StepRecord("s", StepStatus.DONE, 0.0, 1.0, result="1")
    assert await driver.save_step(claim.lease, step)
    note = AttemptNote(1, "w1", 0.5)
    await driver.settle([Retry(claim.lease, delay=60, error="later", note=note)])
    deleted = await driver.delete(job_id)
    assert (deleted.id, deleted.state, deleted.last_error) == (job_id, JobState.READY, "later")
    assert await driver.get(job_id) is None
    assert list(await driver.load_steps(job_id)) == []
    assert list(await driver.load_attempts(job_id)) == []
    [answer] = await driver.enqueue([new_job(key="k1")])
    assert answer.created  # the key was freed with it
    with pytest.raises(JobNotFound):
        await driver.delete(job_id)


@pytest.mark.parametrize(
    "state", ["ready-delayed", "dead", "cancelled", "completed", "parked", "suspended-event"]
)
async def test_delete_takes_a_job_in_any_state_but_running(
    driver: Driver, manual_clock: ManualClock, state: str
) -> None:
    placed = await place(driver, manual_clock, state)
    assert await driver.delete(placed.job_id) == placed.record
    assert await driver.get(placed.job_id) is None


async def test_a_running_job_is_not_deleted(driver: Driver) -> None:
    job_id = await enqueue_one(driver)
    claim = await claim_one(driver)
    with pytest.raises(InvalidTransition):
        await driver.delete(job_id)
    record = await driver.get(job_id)
    assert record is not None and record.state is JobState.RUNNING
    assert await driver.settle([Complete(claim.lease)]) == [job_id]


async def test_run_now_makes_a_scheduled_or_backing_off_job_due(
    driver: Driver, manual_clock: ManualClock
) -> None:
    scheduled = await enqueue_one(driver, delay=3600)
    assert await driver.claim(["default"], 5, lease=30, worker_id="w") == []
    hurried = await driver.run_now(scheduled)
    assert (hurried.state, hurried.run_at, hurried.attempts) == (
        JobState.READY,
        manual_clock.now,
        0,
    )
    claim = await claim_one(driver)
    assert claim.job_id == scheduled
    await driver.settle([Retry(claim.lease, delay=600, error="backing off")])
    manual_clock.advance(1)
    again = await driver.run_now(scheduled)
    assert (again.run_at, again.attempts, again.last_error) == (
        manual_clock.now,
        1,
        "backing off",
    )
    assert (await claim_one(driver)).attempt == 2
    # A ready job already due is answered as it is.
    due = await enqueue_one(driver)
    manual_clock.advance(5)
    before = await driver.get(due)
    assert await driver.run_now(due) == before


async def test_run_now_wakes_a_waiter(driver: Driver) -> None:
    job_id = await enqueue_one(driver, delay=3600)
    async with a_waiting_worker(driver):
        await driver.run_now(job_id)


@pytest.mark.parametrize("state", ["running", "dead", "completed", "suspended-time"])
async def test_run_now_refuses_a_job_that_is_not_ready(
    driver: Driver, manual_clock: ManualClock, state: str
) -> None:
    placed = await place(driver, manual_clock, state)
    with pytest.raises(InvalidTransition):
        await driver.run_now(placed.job_id)
    assert await driver.get(placed.job_id) == placed.record
    with pytest.raises(JobNotFound):
        await driver.run_now("nope")
