# A claim whose answer its worker never received (Capabilities.hands_back_unheld, issue 32): the
# worker gives the jobs it never learned of their attempts back, and nothing else.
from __future__ import annotations

from typing import cast

import pytest

from jobs_trio._core.records import JobState
from jobs_trio.driver import Driver
from jobs_trio.drivers.contract import HandsBackUnheld
from jobs_trio.testing._clock import ManualClock

from .helpers import enqueue_one


def _handing_back(driver: Driver) -> HandsBackUnheld:
    if not driver.capabilities.hands_back_unheld:
        pytest.skip("the driver does not declare hands_back_unheld")
    return cast(HandsBackUnheld, driver)


async def test_a_claim_whose_answer_was_lost_is_claimed_again_with_its_attempts_back(
    driver: Driver, manual_clock: ManualClock
) -> None:
    unheld = _handing_back(driver)
    lost = await enqueue_one(driver)
    manual_clock.advance(1)
    kept = await enqueue_one(driver)
    manual_clock.advance(1)
    others = await enqueue_one(driver)
    manual_clock.advance(1)
    other_queue = await enqueue_one(driver, queue="elsewhere")
    # w1's claim committed; its answer reached it for `kept` only (a test stands for the
    # dropped connection by not keeping the other claim's token).
    claims = await driver.claim(["default"], 2, lease=30, worker_id="w1")
    by_id = {c.job_id: c for c in claims}
    assert set(by_id) == {lost, kept}
    [elsewhere] = await driver.claim(["elsewhere"], 1, lease=30, worker_id="w1")
    [theirs] = await driver.claim(["default"], 1, lease=30, worker_id="w2")
    assert theirs.job_id == others

    given = await unheld.hand_back_unheld("w1", ["default"], [by_id[kept].token])
    assert list(given) == [lost]
    # Claimable at once, its attempt given back; the held run, another queue's and another
    # worker's jobs are untouched.
    [again] = await driver.claim(["default"], 3, lease=30, worker_id="w3")
    assert (again.job_id, again.attempt) == (lost, 1)
    for job_id, worker in ((kept, "w1"), (others, "w2"), (other_queue, "w1")):
        record = await driver.get(job_id)
        assert record is not None
        assert (record.state, record.worker_id, record.attempts) == (
            JobState.RUNNING,
            worker,
            1,
        )
    assert elsewhere.job_id == other_queue
    # The held run still settles: its token was never touched.
    assert await unheld.hand_back_unheld("w1", ["default"], [by_id[kept].token]) == []
