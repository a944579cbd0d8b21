# settle_and_claim (SettlesWithClaims, issue 16), on every driver that has it: the settles and
# the claim as one write — both answered as apart, a settled job never claimed by the same call,
# and a refused settlement leaves nothing written, the claim included.
from __future__ import annotations

import pytest

from jobs_trio.driver import Driver, SettlesWithClaims
from jobs_trio.errors import JobsError
from jobs_trio.records import Complete, JobState, Retry
from jobs_trio.testing.clock import ManualClock

from .helpers import claim_one, enqueue_one


def carrying(driver: Driver) -> SettlesWithClaims:
    if not isinstance(driver, SettlesWithClaims):
        pytest.skip(f"{type(driver).__name__} settles and claims apart (no settle_and_claim)")
    return driver


async def test_it_settles_and_claims_as_settle_then_claim_would(driver: Driver) -> None:
    both = carrying(driver)
    first = await enqueue_one(driver, priority=0)
    second = await enqueue_one(driver, priority=1)
    claim = await claim_one(driver)
    applied, claims = await both.settle_and_claim(
        [Complete(claim.lease, result='{"n": 1}')], ["default"], 5, lease=30, worker_id="w2"
    )
    assert list(applied) == [first]
    assert [(c.job_id, c.attempt) for c in claims] == [(second, 1)]
    done, running = await driver.get(first), await driver.get(second)
    assert done is not None and running is not None
    assert (done.state, done.result, done.attempts) == (JobState.COMPLETED, '{"n": 1}', 1)
    assert (running.state, running.worker_id) == (JobState.RUNNING, "w2")


async def test_a_stale_settlement_applies_nothing_and_the_claim_still_happens(
    driver: Driver, manual_clock: ManualClock
) -> None:
    both = carrying(driver)
    job = await enqueue_one(driver, priority=0)
    other = await enqueue_one(driver, priority=1)
    old = await claim_one(driver, lease=10)
    manual_clock.advance(11)
    # The lease lapsed: another worker holds the job now.
    [again] = await driver.claim(["default"], 1, lease=30, worker_id="w2")
    assert again.job_id == job
    applied, claims = await both.settle_and_claim(
        [Complete(old.lease)], ["default"], 5, lease=30, worker_id="w1"
    )
    assert list(applied) == []  # fenced
    assert [c.job_id for c in claims] == [other]
    held = await driver.get(job)
    assert held is not None and (held.state, held.worker_id) == (JobState.RUNNING, "w2")


async def test_a_lapsed_lease_settled_by_the_call_is_not_also_claimed_by_it(
    driver: Driver, manual_clock: ManualClock
) -> None:
    # Its token is still current, so the settle applies; its lease has lapsed, so apart from
    # the settle it would be a claim's candidate. One write must not do both to one job.
    both = carrying(driver)
    job = await enqueue_one(driver)
    claim = await claim_one(driver, lease=10)
    manual_clock.advance(11)
    applied, claims = await both.settle_and_claim(
        [Complete(claim.lease)], ["default"], 5, lease=30, worker_id="w1"
    )
    assert list(applied) == [job] and list(claims) == []
    record = await driver.get(job)
    assert record is not None and (record.state, record.attempts) == (JobState.COMPLETED, 1)


async def test_mixed_kinds_settle_and_claim_together(driver: Driver) -> None:
    both = carrying(driver)
    ids = {await enqueue_one(driver) for _ in range(3)}
    a, b = await driver.claim(["default"], 2, lease=30, worker_id="w1")
    applied, claims = await both.settle_and_claim(
        [Complete(a.lease), Retry(b.lease, delay=60, error="again")],
        ["default"],
        5,
        lease=30,
        worker_id="w1",
    )
    assert sorted(applied) == sorted([a.job_id, b.job_id])
    assert [c.job_id for c in claims] == list(ids - {a.job_id, b.job_id})
    done, retried = await driver.get(a.job_id), await driver.get(b.job_id)
    assert done is not None and done.state is JobState.COMPLETED
    assert retried is not None and (retried.state, retried.last_error) == (JobState.READY, "again")


async def test_a_refused_settlement_writes_nothing_not_even_the_claim(driver: Driver) -> None:
    both = carrying(driver)
    job = await enqueue_one(driver, priority=0)
    waiting = await enqueue_one(driver, priority=1)
    claim = await claim_one(driver)
    # A NUL (PostgreSQL refuses it) and a lone surrogate (SQLite cannot encode it).
    with pytest.raises(JobsError):
        await both.settle_and_claim(
            [Complete(claim.lease, result='"\x00\ud800"')],
            ["default"],
            5,
            lease=30,
            worker_id="w1",
        )
    held, untouched = await driver.get(job), await driver.get(waiting)
    assert held is not None and (held.state, held.worker_id) == (JobState.RUNNING, "w1")
    assert untouched is not None and (untouched.state, untouched.attempts) == (JobState.READY, 0)
    # Nothing was lost: the same lease still settles once the value is one it can store.
    assert list(await driver.settle([Complete(claim.lease, result='"ok"')])) == [job]
