# One claim over a mix of due jobs and lapsed jobs, across two queues, with a limit smaller than
# each kind: the rule every driver follows for the hand-back of lapsed jobs (Driver.claim).
from __future__ import annotations

from jobs_trio._core.records import JobState
from jobs_trio.driver import Driver
from jobs_trio.drivers._rules import ORPHANED_ERROR
from jobs_trio.testing._clock import ManualClock

from .helpers import enqueue_one, needs_claims_alone


async def _states(driver: Driver, ids: dict[str, str]) -> dict[str, JobState]:
    states = {}
    for label, job_id in ids.items():
        record = await driver.get(job_id)
        assert record is not None
        states[label] = record.state
    return states


async def test_a_claim_hands_back_at_most_its_limit_of_lapsed_jobs_then_claims_in_order(
    driver: Driver, manual_clock: ManualClock
) -> None:
    # The rule (issues 18 and 45): a claim first hands back up to `limit` lapsed jobs, the
    # best first in claim order, each at its place in line (orphaned), then takes up to
    # `limit` due jobs, those it handed back included. Bounded work per claim: the lapsed
    # jobs left over stay lapsed, due at once, for the next claim; nothing lost or skipped.
    needs_claims_alone(driver)
    ids: dict[str, str] = {}
    for label, queue in (("L1", "a"), ("L2", "b"), ("L3", "a")):
        ids[label] = await enqueue_one(driver, queue=queue)
        manual_clock.advance(1)
    first = await driver.claim(["a", "b"], 3, lease=10, worker_id="dies")
    assert sorted(c.job_id for c in first) == sorted(ids.values())
    for label, queue, priority in (("D1", "a", 0), ("D2", "b", 0), ("D3", "a", 1)):
        ids[label] = await enqueue_one(driver, queue=queue, priority=priority)
        manual_clock.advance(1)
    manual_clock.advance(10)  # L1, L2 and L3 have lapsed

    claims = await driver.claim(["a", "b"], 2, lease=10, worker_id="w2")

    # L1 and L2 handed back, first in line (their run-ats are the oldest), and taken again,
    # their attempts not counted; L3 is past this claim's bound and still lapsed.
    assert [(c.job_id, c.attempt) for c in claims] == [(ids["L1"], 1), (ids["L2"], 1)]
    assert await _states(driver, ids) == {
        "L1": JobState.RUNNING,
        "L2": JobState.RUNNING,
        "L3": JobState.RUNNING,
        "D1": JobState.READY,
        "D2": JobState.READY,
        "D3": JobState.READY,
    }
    lapsed = await driver.get(ids["L3"])
    assert lapsed is not None and lapsed.orphans == 0 and lapsed.worker_id == "dies"
    taken = await driver.get(ids["L1"])
    assert taken is not None and taken.last_error == ORPHANED_ERROR.format(orphans=1)

    claims = await driver.claim(["a", "b"], 2, lease=10, worker_id="w2")
    assert [c.job_id for c in claims] == [ids["L3"], ids["D1"]]

    claims = await driver.claim(["a", "b"], 2, lease=10, worker_id="w2")
    assert [c.job_id for c in claims] == [ids["D2"], ids["D3"]]
    assert set((await _states(driver, ids)).values()) == {JobState.RUNNING}
