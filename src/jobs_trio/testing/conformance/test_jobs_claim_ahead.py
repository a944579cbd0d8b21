from __future__ import annotations

import pytest

from jobs_trio._core.records import Complete, JobRecord, JobState
from jobs_trio.driver import Driver
from jobs_trio.drivers._rules import KILLED_WORKER_ERROR, SUSPECT_AT
from jobs_trio.drivers.contract import SettlesWithClaims
from jobs_trio.testing._clock import ManualClock

from .helpers import enqueue_one, needs_claims_alone


async def _get(driver: Driver, job_id: str) -> JobRecord:
    record = await driver.get(job_id)
    assert record is not None
    return record


# Every claim below with and without rescue (a worker's claims between its rescues take no lapsed
# job, claim_loop.RESCUE_EVERY: a statement of its own on PostgreSQL) answers alike.
@pytest.mark.parametrize("rescue", [True, False])
async def test_claims_past_a_queues_free_slots_are_marked_ahead(
    driver: Driver, manual_clock: ManualClock, rescue: bool
) -> None:
    for queue in ("a", "a", "a", "b", "b"):
        await enqueue_one(driver, queue=queue)
        manual_clock.advance(1)
    claims = await driver.claim(
        ["a", "b"],
        {"a": 3, "b": 2},
        lease=30,
        worker_id="w",
        free={"a": 1, "b": 2},
        rescue=rescue,
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
    [plain] = await driver.claim(["a"], 1, lease=30, worker_id="w", rescue=rescue)
    assert not plain.ahead  # no free= told: every claim has its slot


async def test_a_lapsed_claim_ahead_never_started_gets_its_attempt_back(
    driver: Driver, manual_clock: ManualClock
) -> None:
    needs_claims_alone(driver)
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
    # Neither is charged: the one that ran is orphaned (rules.orphaning), the one held ahead,
    # which never ran, is handed back as it was: not even an orphaning.
    assert {c.job_id: c.attempt for c in again} == {running: 1, held: 1}
    assert [(await _get(driver, j)).orphans for j in (running, held)] == [1, 0]
    record = await _get(driver, held)
    assert record.attempts == 1 and record.state is JobState.RUNNING


async def test_a_renewal_that_records_a_start_makes_the_lapse_an_orphaning(
    driver: Driver, manual_clock: ManualClock
) -> None:
    needs_claims_alone(driver)
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
    assert {c.job_id: c.attempt for c in again}[started] == 1  # orphaned: not charged
    assert [(await _get(driver, j)).orphans for j in (started, unstarted)] == [1, 0]


async def test_a_claim_ahead_on_its_last_attempt_is_not_buried_by_its_lapse(
    driver: Driver, manual_clock: ManualClock
) -> None:
    needs_claims_alone(driver)
    ran = await enqueue_one(driver, attempts=1)
    manual_clock.advance(1)  # claim order: by run-at
    held = await enqueue_one(driver, attempts=1)
    await driver.claim(["default"], 2, lease=10, worker_id="w1", free={"default": 1})
    manual_clock.advance(11)
    again = await driver.claim(["default"], 2, lease=10, worker_id="w2")
    # Both run again as their only attempt: the one that ran is orphaned, not charged (it
    # was dead-lettered out of attempts before the orphan rule), the held one handed back.
    assert [(c.job_id, c.attempt) for c in again] == [(ran, 1), (held, 1)]


async def test_lapses_handed_back_are_bounded_so_a_job_that_kills_its_worker_still_dies(
    driver: Driver, manual_clock: ManualClock
) -> None:
    needs_claims_alone(driver)
    # The case the bound is for: a job claimed ahead that did start and killed its worker
    # before a renewal recorded the start. Each lapse is handed back at most max_attempts
    # times in the job's life; after that each lapse is an orphaning, and the orphan rule
    # ends it: a suspect (claimed alone: here every claim is) whose worker dies again.
    job_id = await enqueue_one(driver, attempts=2)
    runs = 0
    while True:
        claims = await driver.claim(
            ["default"], 1, lease=10, worker_id="w", free={"default": 0}, alone=True
        )
        if not claims:
            break
        runs += 1
        assert claims[0].ahead
        manual_clock.advance(11)
        assert runs < 10, "a lapsing job claimed ahead must not loop forever"
    assert runs == 2 + SUSPECT_AT + 1  # two lapses handed back, two orphanings, then alone
    record = await _get(driver, job_id)
    assert record.state is JobState.DEAD and record.last_error == KILLED_WORKER_ERROR
    assert record.attempts == 1  # the run alone, charged


async def test_retry_of_a_dead_job_renews_the_bound_on_lapses_handed_back(
    driver: Driver, manual_clock: ManualClock
) -> None:
    needs_claims_alone(driver)
    job_id = await enqueue_one(driver, attempts=1)
    # One lapse handed back, then orphanings until it dies alone.
    for _ in range(1 + SUSPECT_AT + 1):
        await driver.claim(["default"], 1, lease=10, worker_id="w", free={"default": 0}, alone=True)
        manual_clock.advance(11)
    assert await driver.claim(["default"], 1, lease=10, worker_id="w", alone=True) == []
    assert (await _get(driver, job_id)).state is JobState.DEAD
    await driver.retry(job_id)
    [claim] = await driver.claim(["default"], 1, lease=10, worker_id="w", free={"default": 0})
    manual_clock.advance(11)
    [again] = await driver.claim(["default"], 1, lease=10, worker_id="w")
    assert (claim.attempt, again.attempt) == (1, 1)
    # Handed back again after the retry, as it was: not an orphaning.
    assert (await _get(driver, job_id)).orphans == 0


# Every claim below with and without rescue (a worker's claims between its rescues take no lapsed
# job, claim_loop.RESCUE_EVERY: a statement of its own on PostgreSQL) answers alike.
@pytest.mark.parametrize("rescue", [True, False])
async def test_settle_and_claim_marks_claims_ahead_too(
    driver: Driver, manual_clock: ManualClock, rescue: bool
) -> None:
    needs_claims_alone(driver)
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
        rescue=rescue,
    )
    assert applied == [done.job_id]
    assert [c.ahead for c in claims] == [False, True, True]
    manual_clock.advance(11)
    again = await driver.claim(["default"], 3, lease=10, worker_id="w2")
    # None is charged: the one with its slot is orphaned, the two ahead handed back.
    assert sorted(c.attempt for c in again) == [1, 1, 1]
    orphans = sorted([(await _get(driver, c.job_id)).orphans for c in again])
    assert orphans == [0, 0, 1]
