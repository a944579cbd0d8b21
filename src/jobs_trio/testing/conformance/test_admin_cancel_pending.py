# An operator's cancel still pending when the attempt ends: how each kind of ending meets it.
# The race an operator loses most often (the body fails before the next renewal), on every driver.
from __future__ import annotations

from collections.abc import Callable

import pytest
import trio
from prometheus_client import CollectorRegistry

from jobs_trio import Registry
from jobs_trio._core.backoff import Backoff
from jobs_trio._core.metrics import Metrics
from jobs_trio._core.operator_transitions import OPERATOR_CANCEL_ERROR
from jobs_trio._core.records import (
    CancelJob,
    Complete,
    DeadLetter,
    JobState,
    Lease,
    Park,
    Retry,
    Settlement,
    Suspend,
)
from jobs_trio._run.worker import Worker
from jobs_trio.driver import Driver
from jobs_trio.testing._clock import ManualClock

from .helpers import claim_one, enqueue_one

# Endings that would leave the job live: with a cancel pending, each ends it cancelled, its
# attempt counted (a suspension or a park hands it back otherwise), the ending named.
YIELDING: dict[str, tuple[Callable[[Lease], Settlement], str]] = {
    "failed": (
        lambda lease: Retry(lease, delay=5.0, error="boom"),
        f"{OPERATOR_CANCEL_ERROR} (the attempt ended first: boom)",
    ),
    "interrupted": (
        lambda lease: Retry(lease, delay=0.0, error="drained", hands_back=True),
        f"{OPERATOR_CANCEL_ERROR} (the attempt ended first: drained)",
    ),
    "suspended-on-time": (lambda lease: Suspend(lease, delay=60.0), OPERATOR_CANCEL_ERROR),
    "suspended-on-event": (
        lambda lease: Suspend(lease, delay=60.0, event="paid"),
        OPERATOR_CANCEL_ERROR,
    ),
    "parked": (
        lambda lease: Park(lease, reason="unknown job name"),
        f"{OPERATOR_CANCEL_ERROR} (the attempt ended first: unknown job name)",
    ),
}


@pytest.mark.parametrize("ending", sorted(YIELDING))
async def test_a_pending_cancel_wins_over_an_ending_that_would_run_the_job_again(
    driver: Driver, manual_clock: ManualClock, ending: str
) -> None:
    make, error = YIELDING[ending]
    job_id = await enqueue_one(driver, attempts=5)
    claim = await claim_one(driver)
    await driver.cancel(job_id)
    manual_clock.advance(1.0)
    before = await driver.get(job_id)
    assert before is not None

    assert await driver.settle([make(claim.lease)]) == [job_id]

    record = await driver.get(job_id)
    assert record is not None
    assert record.state is JobState.CANCELLED
    assert record.last_error == error
    assert record.attempts == 1  # counted, as a cancel heard at renewal counts it
    assert record.cancel_requested is False
    assert record.run_at == before.run_at  # not moved to a retry's or a suspension's time
    assert record.wait_event is None
    assert record.lease_until is None and record.worker_id is None
    assert record.updated_at == manual_clock.now
    # It never runs again: not now, not after any delay, not on the event it would have awaited.
    await driver.send_event("paid", "{}")
    manual_clock.advance(3600.0)
    assert await driver.claim(["default"], 10, lease=30, worker_id="w2") == []
    assert (await driver.get(job_id)) == record


@pytest.mark.parametrize(
    ("ending", "state"),
    [
        (lambda lease: Complete(lease, result='"done"'), JobState.COMPLETED),
        (lambda lease: DeadLetter(lease, error="fatal"), JobState.DEAD),
        (lambda lease: CancelJob(lease, error=OPERATOR_CANCEL_ERROR), JobState.CANCELLED),
    ],
    ids=["completed", "dead", "cancelled"],
)
async def test_an_ending_that_finishes_the_job_stands_despite_a_pending_cancel(
    driver: Driver, ending: Callable[[Lease], Settlement], state: JobState
) -> None:
    job_id = await enqueue_one(driver)
    claim = await claim_one(driver)
    await driver.cancel(job_id)
    settlement = ending(claim.lease)
    assert await driver.settle([settlement]) == [job_id]
    record = await driver.get(job_id)
    assert record is not None
    assert record.state is state and record.cancel_requested is False
    assert record.attempts == 1
    assert record.result == ("done" if state is JobState.COMPLETED else None)
    assert record.last_error == getattr(settlement, "error", None)


async def test_a_pending_cancel_is_kept_by_a_stale_settlement(
    driver: Driver, manual_clock: ManualClock
) -> None:
    # The fence first: a settlement that no longer holds the job changes nothing, the flag
    # included, so the current run's worker still hears the cancel at its renewal.
    job_id = await enqueue_one(driver, attempts=5)
    old = await claim_one(driver, lease=10)
    manual_clock.advance(11)
    new = await claim_one(driver)
    await driver.cancel(job_id)
    assert await driver.settle([Retry(old.lease, delay=0, error="late")]) == []
    record = await driver.get(job_id)
    assert record is not None and record.state is JobState.RUNNING and record.cancel_requested
    result = await driver.renew([new.lease], lease=30)
    assert result.cancel_requested == {new.token}


async def test_a_batch_cancels_only_the_flagged_job(driver: Driver) -> None:
    # One statement per kind on PostgreSQL: the flag is read per row, not per batch.
    flagged = await enqueue_one(driver)
    other = await enqueue_one(driver)
    claims = {c.job_id: c for c in await driver.claim(["default"], 2, lease=30, worker_id="w")}
    await driver.cancel(flagged)
    applied = await driver.settle(
        [Retry(claims[flagged].lease, 0, "boom"), Retry(claims[other].lease, 0, "boom")]
    )
    assert sorted(applied) == sorted([flagged, other])
    flagged_record, other_record = await driver.get(flagged), await driver.get(other)
    assert flagged_record is not None and flagged_record.state is JobState.CANCELLED
    assert other_record is not None and other_record.state is JobState.READY
    assert other_record.last_error == "boom"
    [again] = await driver.claim(["default"], 5, lease=30, worker_id="w")
    assert again.job_id == other


async def test_a_worker_whose_body_fails_before_the_renewal_leaves_the_job_cancelled(
    driver: Driver,
) -> None:
    # The whole race through a worker: the operator cancels while the body runs, the body raises
    # before any renewal could tell the worker, and the job still never runs again.
    registry = Registry()
    started, go = trio.Event(), trio.Event()
    runs = 0

    @registry.job("report", attempts=5, backoff=Backoff(base=0, jitter=0))
    async def report(ctx: object, payload: None) -> None:
        nonlocal runs
        runs += 1
        started.set()
        await go.wait()
        raise RuntimeError("upstream down")

    job_id = await report.enqueue(driver)
    w = Worker(
        driver, registry, lease=3600, stats_interval=None, metrics=Metrics(CollectorRegistry())
    )
    async with trio.open_nursery() as nursery:
        nursery.start_soon(w.tick)
        await started.wait()
        await driver.cancel(job_id)
        go.set()
    record = await driver.get(job_id)
    assert record is not None and record.state is JobState.CANCELLED
    assert record.last_error is not None and "upstream down" in record.last_error
    assert await w.tick() == [] and runs == 1
