from __future__ import annotations

import json
from typing import cast

import attrs
import pytest

from jobs_trio._core.records import Complete, JobState
from jobs_trio.driver import Driver, SettlesWithClaims
from jobs_trio.testing._clock import ManualClock

from .helpers import a_waiting_worker, claim_one, enqueue_one, new_job


async def test_enqueue_then_claim_returns_the_job_with_attempt_one(driver: Driver) -> None:
    job_id = await enqueue_one(driver, name="emails.send", payload={"to": "a@b.c"})
    claim = await claim_one(driver)
    assert claim.job_id == job_id
    assert claim.name == "emails.send"
    assert json.loads(claim.payload) == {"to": "a@b.c"}
    assert claim.attempt == 1
    record = await driver.get(job_id)
    assert record is not None and record.state is JobState.RUNNING and record.attempts == 1


async def test_a_claimed_job_is_not_claimed_twice(driver: Driver) -> None:
    await enqueue_one(driver)
    assert len(await driver.claim(["default"], 10, lease=30, worker_id="a")) == 1
    assert await driver.claim(["default"], 10, lease=30, worker_id="b") == []


async def test_batch_enqueue_and_claim_up_to_limit(driver: Driver) -> None:
    answers = await driver.enqueue([new_job() for _ in range(7)])
    assert len(answers) == 7 and all(a.created for a in answers)
    assert len({a.job_id for a in answers}) == 7
    first = await driver.claim(["default"], 5, lease=30, worker_id="w")
    second = await driver.claim(["default"], 5, lease=30, worker_id="w")
    assert len(first) == 5 and len(second) == 2
    assert {c.job_id for c in [*first, *second]} == {a.job_id for a in answers}
    assert len({c.token for c in [*first, *second]}) == 7


async def test_claim_only_from_the_queues_asked(driver: Driver) -> None:
    await enqueue_one(driver, queue="a")
    b = await enqueue_one(driver, queue="b")
    claims = await driver.claim(["b", "c"], 10, lease=30, worker_id="w")
    assert [c.job_id for c in claims] == [b]


async def test_a_delayed_job_is_claimed_only_once_due(
    driver: Driver, manual_clock: ManualClock
) -> None:
    job_id = await enqueue_one(driver, delay=10)
    assert await driver.claim(["default"], 1, lease=30, worker_id="w") == []
    manual_clock.advance(10)
    assert (await claim_one(driver)).job_id == job_id


async def test_lower_priority_number_is_claimed_first_then_oldest(
    driver: Driver, manual_clock: ManualClock
) -> None:
    late = await enqueue_one(driver, priority=5)
    manual_clock.advance(1)
    urgent = await enqueue_one(driver, priority=-1)
    manual_clock.advance(1)
    normal_old = await enqueue_one(driver, priority=0)
    manual_clock.advance(1)
    normal_new = await enqueue_one(driver, priority=0)
    claims = await driver.claim(["default"], 4, lease=30, worker_id="w")
    assert [c.job_id for c in claims] == [urgent, normal_old, normal_new, late]


async def test_unique_key_while_live_yields_one_job(driver: Driver) -> None:
    [first, second] = await driver.enqueue([new_job(key="k1"), new_job(key="k1")])
    assert first.created and not second.created
    assert second.job_id == first.job_id
    [third] = await driver.enqueue([new_job(key="k1")])
    assert not third.created and third.job_id == first.job_id
    assert len(await driver.list_jobs()) == 1


async def test_unique_key_is_held_while_running_and_freed_when_finished(driver: Driver) -> None:
    from jobs_trio._core.records import Complete

    job_id = await enqueue_one(driver, key="k")
    claim = await claim_one(driver)
    [again] = await driver.enqueue([new_job(key="k")])
    assert not again.created and again.job_id == job_id
    assert await driver.settle([Complete(claim.lease, result="1")]) == [job_id]
    [fresh] = await driver.enqueue([new_job(key="k")])
    assert fresh.created and fresh.job_id != job_id


async def test_a_lapsed_lease_is_claimed_again_with_a_new_token(
    driver: Driver, manual_clock: ManualClock
) -> None:
    job_id = await enqueue_one(driver)
    first = await claim_one(driver, lease=10)
    manual_clock.advance(5)
    assert await driver.claim(["default"], 1, lease=10, worker_id="w2") == []
    manual_clock.advance(6)
    second = await claim_one(driver, lease=10)
    assert second.job_id == job_id and second.token != first.token
    # Its worker died under it: orphaned, the attempt not counted (rules.orphaning), where the
    # driver has the rule; counted where it has not.
    assert second.attempt == (1 if driver.capabilities.claims_alone else 2)


async def test_a_lapsed_job_out_of_attempts_is_dead_lettered_only_without_the_orphan_rule(
    driver: Driver, manual_clock: ManualClock
) -> None:
    job_id = await enqueue_one(driver, attempts=1)
    await claim_one(driver, lease=10)
    manual_clock.advance(11)
    again = await driver.claim(["default"], 1, lease=10, worker_id="w2")
    record = await driver.get(job_id)
    assert record is not None and record.last_error and "lease" in record.last_error
    if driver.capabilities.claims_alone:
        # Orphaned, not charged: it runs again as its only attempt (test_orphans.py).
        assert [(c.job_id, c.attempt) for c in again] == [(job_id, 1)]
        assert record.state is JobState.RUNNING and record.orphans == 1
    else:
        # Its lapse counted the attempt, its last: dead-lettered by the claim, not run.
        assert again == [] and record.state is JobState.DEAD


async def test_wait_for_work_returns_when_a_job_is_enqueued(driver: Driver) -> None:
    async with a_waiting_worker(driver):
        await enqueue_one(driver)


async def test_wait_for_work_returns_at_once_when_work_is_due(driver: Driver) -> None:
    import trio

    await enqueue_one(driver)
    with trio.fail_after(5):
        await driver.wait_for_work(["default"], timeout=60)


async def test_each_field_of_a_claim_is_its_jobs_by_either_claim_call(
    driver: Driver, manual_clock: ManualClock
) -> None:
    # Every field a claim carries, each a value no other field has, by claim() and by
    # settle_and_claim(): a driver that maps its rows to claims by position (PostgreSQL's, for
    # speed) would hand a swapped pair to the body.
    context = '{"tenant":"t-7"}'
    jobs = [
        attrs.evolve(
            new_job(f"field.{n}", queue=f"fields{n}", payload={"n": n}, attempts=4 + n, delay=5.0),
            context=context,
        )
        for n in range(2)
    ]
    await driver.enqueue(jobs)
    due = driver.now() + 5.0
    manual_clock.advance(6.0)
    # The first taken ahead (no free slot told), the second not: ahead and alone differ on it.
    [first] = await driver.claim(["fields0"], 1, lease=20.0, worker_id="w1", free={"fields0": 0})
    settled = [Complete(first.lease, "null")]
    if driver.capabilities.settles_with_claims:
        both = cast(SettlesWithClaims, driver)
        [done], [second] = await both.settle_and_claim(
            settled, ["fields1"], 1, lease=20.0, worker_id="w1"
        )
    else:
        [done] = await driver.settle(settled)
        second = await claim_one(driver, queue="fields1", lease=20.0)
    assert done == first.job_id
    for n, claim in enumerate([first, second]):
        job = jobs[n]
        assert (claim.job_id, claim.name, claim.queue) == (job.job_id, f"field.{n}", f"fields{n}")
        assert (json.loads(claim.payload), claim.attempt, claim.max_attempts) == (
            {"n": n},
            1,
            4 + n,
        )
        assert claim.lease_until == pytest.approx(driver.now() + 20.0)
        assert claim.due_at == pytest.approx(due)
        assert (claim.context, claim.ahead, claim.alone) == (context, n == 0, False)
        assert claim.token and claim.token not in (claim.job_id, claim.name, claim.payload)
