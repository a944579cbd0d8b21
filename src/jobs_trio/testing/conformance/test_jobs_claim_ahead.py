from __future__ import annotations

from jobs_trio._core.records import Complete, JobState
from jobs_trio.driver import Driver
from jobs_trio.drivers.contract import SettlesWithClaims
from jobs_trio.testing._clock import ManualClock

from .helpers import enqueue_one


async def test_claims_past_a_queues_free_slots_are_marked_ahead(
    driver: Driver, manual_clock: ManualClock
) -> None:
    for queue in ("a", "a", "a", "b", "b"):
        await enqueue_one(driver, queue=queue)
        manual_clock.advance(1)
    claims = await driver.claim(
        ["a", "b"], {"a": 3, "b": 2}, lease=30, worker_id="w", free={"a": 1, "b": 2}
    )
    # In claim order within each queue: a's first has its slot, the two after it are ahead.
    assert [(c.queue, c.ahead) for c in claims] == [
        ("a", False),
        ("a", True),
        ("a", True),
        ("b", False),
        ("b", False),
    ]
    await enqueue_one(driver, queue="a")
    [plain] = await driver.claim(["a"], 1, lease=30, worker_id="w")
    assert not plain.ahead  # no free= told: every claim has its slot


async def test_a_lapsed_claim_ahead_never_started_gets_its_attempt_back(
    driver: Driver, manual_clock: ManualClock
) -> None:
    running = await enqueue_one(driver)
    manual_clock.advance(1)  # claim order: by run-at
    held = await enqueue_one(driver)
    first = await driver.claim(["default"], 2, lease=10, worker_id="w1", free={"default": 1})
    assert [(c.job_id, c.attempt, c.ahead) for c in first] == [
        (running, 1, False),
        (held, 1, True),
    ]
    manual_clock.advance(11)  # w1 died holding both
    again = await driver.claim(["default"], 2, lease=10, worker_id="w2")
    assert {c.job_id: c.attempt for c in again} == {running: 2, held: 1}
    record = await driver.get(held)
    assert record is not None and record.attempts == 1 and record.state is JobState.RUNNING


async def test_a_renewal_that_records_a_start_makes_the_attempt_count(
    driver: Driver, manual_clock: ManualClock
) -> None:
    await enqueue_one(driver)
    manual_clock.advance(1)  # claim order: by run-at
    started = await enqueue_one(driver)
    manual_clock.advance(1)
    unstarted = await enqueue_one(driver)
    claims = await driver.claim(["default"], 3, lease=10, worker_id="w1", free={"default": 1})
    by_id = {c.job_id: c for c in claims}
    renewed = await driver.renew(
        [c.lease for c in claims], lease=10, started=[by_id[started].token]
    )
    assert renewed.held == {c.token for c in claims}
    manual_clock.advance(11)
    again = await driver.claim(["default"], 3, lease=10, worker_id="w2")
    attempts = {c.job_id: c.attempt for c in again}
    assert (attempts[started], attempts[unstarted]) == (2, 1)


async def test_a_claim_ahead_on_its_last_attempt_is_not_buried_by_its_lapse(
    driver: Driver, manual_clock: ManualClock
) -> None:
    await enqueue_one(driver, attempts=1)
    manual_clock.advance(1)  # claim order: by run-at
    held = await enqueue_one(driver, attempts=1)
    await driver.claim(["default"], 2, lease=10, worker_id="w1", free={"default": 1})
    manual_clock.advance(11)
    again = await driver.claim(["default"], 2, lease=10, worker_id="w2")
    # The one that ran spent its only attempt and is dead-lettered; the held one runs.
    assert [(c.job_id, c.attempt) for c in again] == [(held, 1)]


async def test_lapses_handed_back_are_bounded_so_a_job_that_kills_its_worker_still_dies(
    driver: Driver, manual_clock: ManualClock
) -> None:
    # The case the bound is for: a job claimed ahead that did start and killed its worker
    # before a renewal recorded the start. Each lapse is handed back at most max_attempts
    # times in the job's life; after that each lapse counts, and the job is dead-lettered.
    job_id = await enqueue_one(driver, attempts=2)
    runs = 0
    while True:
        claims = await driver.claim(["default"], 1, lease=10, worker_id="w", free={"default": 0})
        if not claims:
            break
        runs += 1
        assert claims[0].ahead
        manual_clock.advance(11)
        assert runs < 10, "a lapsing job claimed ahead must not loop forever"
    assert runs == 4  # two lapses handed back, then its two attempts
    record = await driver.get(job_id)
    assert record is not None and record.state is JobState.DEAD and record.attempts == 2


async def test_retry_of_a_dead_job_renews_the_bound_on_lapses_handed_back(
    driver: Driver, manual_clock: ManualClock
) -> None:
    job_id = await enqueue_one(driver, attempts=1)
    for _ in range(2):  # one lapse handed back, then its one attempt: dead
        await driver.claim(["default"], 1, lease=10, worker_id="w", free={"default": 0})
        manual_clock.advance(11)
    assert await driver.claim(["default"], 1, lease=10, worker_id="w") == []
    await driver.retry(job_id)
    [claim] = await driver.claim(["default"], 1, lease=10, worker_id="w", free={"default": 0})
    manual_clock.advance(11)
    [again] = await driver.claim(["default"], 1, lease=10, worker_id="w")
    assert (claim.attempt, again.attempt) == (1, 1)  # handed back again after the retry


async def test_settle_and_claim_marks_claims_ahead_too(
    driver: Driver, manual_clock: ManualClock
) -> None:
    if not driver.capabilities.settles_with_claims:
        return
    both: SettlesWithClaims = driver  # type: ignore[assignment]
    await enqueue_one(driver)
    [done] = await driver.claim(["default"], 1, lease=10, worker_id="w")
    for _ in range(3):
        await enqueue_one(driver)
    applied, claims = await both.settle_and_claim(
        [Complete(done.lease, result="1")],
        ["default"],
        {"default": 3},
        lease=10,
        worker_id="w",
        free={"default": 1},
    )
    assert applied == [done.job_id]
    assert [c.ahead for c in claims] == [False, True, True]
    manual_clock.advance(11)
    again = await driver.claim(["default"], 3, lease=10, worker_id="w2")
    assert sorted(c.attempt for c in again) == [1, 1, 2]
