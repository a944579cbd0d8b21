# One claim over a mix of due jobs, lapsed jobs with attempts left and lapsed jobs out of
# attempts, across two queues, with a limit smaller than each kind: the rule every driver follows.
from __future__ import annotations

from jobs_trio._core.records import JobState
from jobs_trio.driver import Driver
from jobs_trio.drivers._rules import LAPSED_ERROR, lapsed_out_of_attempts
from jobs_trio.testing._clock import ManualClock

from .helpers import enqueue_one


async def _states(driver: Driver, ids: dict[str, str]) -> dict[str, JobState]:
    states = {}
    for label, job_id in ids.items():
        record = await driver.get(job_id)
        assert record is not None
        states[label] = record.state
    return states


async def test_a_claim_takes_and_buries_at_most_its_limit_of_each_in_claim_order(
    driver: Driver, manual_clock: ManualClock
) -> None:
    # The rule (issue 18): a claim takes up to `limit` jobs to run (due jobs and lapsed jobs
    # with attempts left) and dead-letters up to `limit` lapsed jobs out of attempts, each the
    # best first in claim order. Bounded work per claim; the exhausted jobs left over stay
    # lapsed, claimable at once, and the next claim buries them: nothing is lost or skipped.
    ids: dict[str, str] = {}
    for label, queue, attempts in (
        ("E1", "a", 1),
        ("E2", "b", 1),
        ("E3", "a", 1),
        ("L1", "a", 3),
    ):
        ids[label] = await enqueue_one(driver, queue=queue, attempts=attempts)
        manual_clock.advance(1)
    first = await driver.claim(["a", "b"], 4, lease=10, worker_id="dies")
    assert sorted(c.job_id for c in first) == sorted(ids.values())
    for label, queue, priority in (("D1", "a", 0), ("D2", "b", 0), ("D3", "a", 1)):
        ids[label] = await enqueue_one(driver, queue=queue, priority=priority)
        manual_clock.advance(1)
    manual_clock.advance(10)  # E1, E2, E3 and L1 have lapsed

    claims = await driver.claim(["a", "b"], 2, lease=10, worker_id="w2")

    assert [c.job_id for c in claims] == [ids["L1"], ids["D1"]]
    assert [c.attempt for c in claims] == [2, 1]
    assert await _states(driver, ids) == {
        "E1": JobState.DEAD,
        "E2": JobState.DEAD,
        "E3": JobState.RUNNING,  # lapsed still: past this claim's bound
        "L1": JobState.RUNNING,
        "D1": JobState.RUNNING,
        "D2": JobState.READY,
        "D3": JobState.READY,
    }
    buried = await driver.get(ids["E1"])
    assert buried is not None and buried.last_error == lapsed_out_of_attempts(1)
    assert buried.lease_until is None and buried.worker_id is None
    reclaimed = await driver.get(ids["L1"])
    assert reclaimed is not None and reclaimed.last_error == LAPSED_ERROR

    claims = await driver.claim(["a", "b"], 2, lease=10, worker_id="w2")

    assert [c.job_id for c in claims] == [ids["D2"], ids["D3"]]
    states = await _states(driver, ids)
    assert states["E3"] is JobState.DEAD
    assert [states[k] for k in ("L1", "D1", "D2", "D3")] == [JobState.RUNNING] * 4


async def test_a_claim_of_only_exhausted_jobs_buries_them_and_claims_nothing(
    driver: Driver, manual_clock: ManualClock
) -> None:
    ids = [await enqueue_one(driver, attempts=1) for _ in range(3)]
    assert len(await driver.claim(["default"], 3, lease=10, worker_id="dies")) == 3
    manual_clock.advance(11)
    assert await driver.claim(["default"], 2, lease=10, worker_id="w2") == []
    assert await driver.claim(["default"], 2, lease=10, worker_id="w2") == []
    for job_id in ids:
        record = await driver.get(job_id)
        assert record is not None and record.state is JobState.DEAD
