# A worker's death charges nobody it cannot blame (issue 45): the claim's hand-back of lapsed
# jobs as orphaned, the suspects claimed only alone, and the rule's dead-letters, on every driver.
from __future__ import annotations

import pytest
import trio

from jobs_trio._core.records import Claim, Complete, DeadLetter, JobState, OutcomeKind, Retry
from jobs_trio.driver import Driver
from jobs_trio.drivers._rules import (
    KILLED_WORKER_ERROR,
    LAPSED_ERROR,
    ORPHANED_ERROR,
    SUSPECT_AT,
)
from jobs_trio.testing._clock import ManualClock

from .helpers import enqueue_one, needs_claims_alone


async def _make_suspect(driver: Driver, clock: ManualClock, n: int = 1) -> list[Claim]:
    """The ``n`` due jobs of "q" run on a worker that dies, are handed back and run again on
    another that dies too: orphaned twice, suspects (ready, left to a claim alone). Answers
    the second run's claims."""
    assert len(await driver.claim(["q"], n, lease=10, worker_id="dies-0")) == n
    clock.advance(11)
    # The claim that finds them lapsed hands them back, and takes them as any due job.
    again = list(await driver.claim(["q"], n, lease=10, worker_id="dies-1"))
    assert len(again) == n and all(c.attempt == 1 for c in again)
    clock.advance(11)
    # Handed back again, suspects now: a claim not alone leaves them.
    assert await driver.claim(["q"], n, lease=10, worker_id="rescuer") == []
    return again


async def test_a_lapsed_job_is_handed_back_orphaned_its_attempt_not_counted(
    driver: Driver, manual_clock: ManualClock
) -> None:
    needs_claims_alone(driver)
    job_id = await enqueue_one(driver, queue="q", attempts=1)
    [first] = await driver.claim(["q"], 1, lease=10, worker_id="dies")
    assert first.attempt == 1
    manual_clock.advance(11)

    # The claim that finds it lapsed hands it back, then takes it as any due job: its only
    # attempt was not spent by the death, so it runs again as attempt 1, not dead.
    [again] = await driver.claim(["q"], 1, lease=10, worker_id="w2")
    assert again.job_id == job_id and again.attempt == 1 and not again.alone
    record = await driver.get(job_id)
    assert record is not None and record.state is JobState.RUNNING
    assert record.orphans == 1 and record.attempts == 1 and record.worker_id == "w2"
    assert record.last_error == ORPHANED_ERROR.format(orphans=1)
    [history] = await driver.load_attempts(job_id)
    assert history.outcome == OutcomeKind.ORPHANED.value
    assert history.attempt == 1 and history.worker_id == "dies" and history.seconds is None
    assert history.error == ORPHANED_ERROR.format(orphans=1)


# Every claim below with and without rescue (a worker's claims between its rescues take no lapsed
# job, claim_loop.RESCUE_EVERY: a statement of its own on PostgreSQL) answers alike.
@pytest.mark.parametrize("rescue", [True, False])
async def test_a_job_orphaned_twice_is_claimed_only_alone_and_nothing_beside_it(
    driver: Driver, manual_clock: ManualClock, rescue: bool
) -> None:
    needs_claims_alone(driver)
    suspect = await enqueue_one(driver, queue="q")
    await _make_suspect(driver, manual_clock)
    record = await driver.get(suspect)
    assert record is not None and record.orphans == SUSPECT_AT and record.state is JobState.READY
    others = [await enqueue_one(driver, queue="q") for _ in range(3)]

    # A worker running something takes the ordinary jobs, never the suspect.
    busy = await driver.claim(["q"], 10, lease=10, worker_id="busy", rescue=rescue)
    assert sorted(c.job_id for c in busy) == sorted(others)
    more = [await enqueue_one(driver, queue="q") for _ in range(2)]
    # One that runs nothing takes the suspect, alone, though more is due and it asked for 10.
    [alone] = await driver.claim(["q"], 10, lease=10, worker_id="idle", alone=True, rescue=rescue)
    assert alone.job_id == suspect and alone.alone and alone.attempt == 1
    # No suspect is left: the next claim alone takes ordinary jobs as any claim does.
    rest = await driver.claim(["q"], 10, lease=10, worker_id="idle2", alone=True, rescue=rescue)
    assert sorted(c.job_id for c in rest) == sorted(more) and not any(c.alone for c in rest)


async def test_a_suspect_whose_worker_dies_while_alone_is_dead_lettered_and_no_other_charged(
    driver: Driver, manual_clock: ManualClock
) -> None:
    needs_claims_alone(driver)
    killer = await enqueue_one(driver, queue="q", attempts=3)
    neighbours = []
    for _ in range(2):
        # Claim order by run-at: ids made in one instant may sort either way.
        manual_clock.advance(1)
        neighbours.append(await enqueue_one(driver, queue="q"))
    # The killer beside two ordinary jobs, twice, each time on a worker that then dies: all
    # three are suspects.
    await _make_suspect(driver, manual_clock, 3)
    # Suspects run alone, one at a time, the best first: the killer, whose worker dies again.
    [alone] = await driver.claim(["q"], 10, lease=10, worker_id="dies-alone", alone=True)
    assert alone.job_id == killer and alone.alone
    manual_clock.advance(11)
    assert await driver.claim(["q"], 10, lease=10, worker_id="rescuer") == []

    record = await driver.get(killer)
    assert record is not None and record.state is JobState.DEAD
    assert record.last_error == KILLED_WORKER_ERROR and "X_KILLED_WORKER" in KILLED_WORKER_ERROR
    assert record.attempts == 1 and record.orphans == SUSPECT_AT + 1  # to blame: charged
    history = await driver.load_attempts(killer)
    assert [h.outcome for h in history] == ["orphaned"] * SUSPECT_AT + ["dead-lettered"]
    assert history[-1].worker_id == "dies-alone" and history[-1].error == KILLED_WORKER_ERROR
    # Its neighbours were charged nothing: each runs alone next, as its attempt 1.
    for job_id in neighbours:
        [claim] = await driver.claim(["q"], 10, lease=10, worker_id=job_id, alone=True)
        assert claim.job_id == job_id and claim.attempt == 1 and claim.alone
        await driver.settle([Complete(claim.lease, "null")])
        done = await driver.get(job_id)
        assert done is not None and done.state is JobState.COMPLETED and done.attempts == 1


async def test_a_settled_suspect_is_still_a_suspect_and_an_operators_retry_forgives_it(
    driver: Driver, manual_clock: ManualClock
) -> None:
    needs_claims_alone(driver)
    suspect = await enqueue_one(driver, queue="q", attempts=1)
    await _make_suspect(driver, manual_clock)
    [alone] = await driver.claim(["q"], 1, lease=10, worker_id="idle", alone=True)
    # Drained and handed back: ready again, a suspect still (claimed alone only).
    await driver.settle([Retry(alone.lease, 0.0, "drained", hands_back=True)])
    assert await driver.claim(["q"], 5, lease=10, worker_id="busy") == []
    [again] = await driver.claim(["q"], 1, lease=10, worker_id="idle", alone=True)
    await driver.settle([DeadLetter(again.lease, "boom")])
    dead = await driver.get(suspect)
    assert dead is not None and dead.state is JobState.DEAD and dead.orphans == SUSPECT_AT

    record = await driver.retry(suspect)

    assert record.orphans == 0 and record.attempts == 0
    [claim] = await driver.claim(["q"], 5, lease=10, worker_id="busy")
    assert claim.job_id == suspect and not claim.alone


async def test_a_job_claimed_ahead_that_never_started_is_handed_back_not_orphaned(
    driver: Driver, manual_clock: ManualClock
) -> None:
    needs_claims_alone(driver)
    if not driver.capabilities.claims_ahead:
        pytest.skip("the driver does not declare claims_ahead")
    job_id = await enqueue_one(driver, queue="q")
    [held] = await driver.claim(["q"], 1, lease=10, worker_id="dies", free={"q": 0})
    assert held.ahead
    manual_clock.advance(11)
    [again] = await driver.claim(["q"], 1, lease=10, worker_id="w2")
    assert again.attempt == 1
    record = await driver.get(job_id)
    assert record is not None and record.orphans == 0 and record.last_error == LAPSED_ERROR
    assert await driver.load_attempts(job_id) == []


async def test_a_lapsed_job_with_a_cancel_pending_ends_cancelled(
    driver: Driver, manual_clock: ManualClock
) -> None:
    needs_claims_alone(driver)
    job_id = await enqueue_one(driver, queue="q")
    await driver.claim(["q"], 1, lease=10, worker_id="dies")
    await driver.cancel(job_id)
    manual_clock.advance(11)
    assert await driver.claim(["q"], 1, lease=10, worker_id="w2") == []
    record = await driver.get(job_id)
    assert record is not None and record.state is JobState.CANCELLED
    assert record.attempts == 0 and not record.cancel_requested


async def test_a_ready_suspect_is_work_only_for_a_wait_alone(
    driver: Driver, manual_clock: ManualClock
) -> None:
    needs_claims_alone(driver)
    await enqueue_one(driver, queue="q")
    await _make_suspect(driver, manual_clock)
    # Alone: due now, answered at once.
    with trio.fail_after(5):
        await driver.wait_for_work(["q"], timeout=60, alone=True)
    # Not alone: no work, so the wait lasts (a busy worker does not spin on it).
    with trio.move_on_after(0.3) as waited:
        await driver.wait_for_work(["q"], timeout=60)
    assert waited.cancelled_caught
