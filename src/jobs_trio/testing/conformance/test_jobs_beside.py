# A driver's connection beside the Trio loop (RenewsBeside): renewals and settlements made from
# a thread, fenced by the claim's token exactly as the driver's own. Skipped for a driver
# without one (its worker then keeps no lease through a blocked loop).
from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar, cast

import pytest
import trio

from jobs_trio._core.records import Complete, JobState, Lease
from jobs_trio.driver import Driver
from jobs_trio.drivers.contract import BesideConnection, RenewsBeside
from jobs_trio.testing._clock import ManualClock

from .helpers import a_claim_taken_over, claim_one, enqueue_one

T = TypeVar("T")


async def _in_thread(beside: BesideConnection, call: Callable[[BesideConnection], T]) -> T:
    return await trio.to_thread.run_sync(call, beside)


def _beside(driver: Driver) -> BesideConnection:
    if not driver.capabilities.renews_beside:
        pytest.skip(f"{type(driver).__name__} has no connection beside the Trio loop")
    return cast(RenewsBeside, driver).beside()


async def test_a_renewal_beside_the_loop_extends_only_a_current_lease(
    driver: Driver, manual_clock: ManualClock
) -> None:
    beside = _beside(driver)
    try:
        await enqueue_one(driver)
        claim = await claim_one(driver, lease=10)
        manual_clock.advance(9)
        stale = Lease(claim.job_id, "not-its-token")
        held = await _in_thread(beside, lambda b: b.renew([claim.lease, stale], lease=10))
        assert held == {claim.token}
        # Extended from now: 11 s past the claim, the lease still holds (no rescue claim).
        manual_clock.advance(2)
        assert await driver.claim(["default"], 1, lease=10, worker_id="w2") == []
    finally:
        await trio.to_thread.run_sync(beside.close)


async def test_a_settlement_beside_the_loop_is_fenced_like_the_drivers_own(
    driver: Driver, manual_clock: ManualClock
) -> None:
    beside = _beside(driver)
    try:
        job_id, first, second = await a_claim_taken_over(driver, manual_clock)
        late = Complete(first.lease, result='"late"')
        assert await _in_thread(beside, lambda b: b.settle([late])) == []
        current = Complete(second.lease, result='"ok"')
        assert await _in_thread(beside, lambda b: b.settle([current])) == [job_id]
        record = await driver.get(job_id)
        assert record is not None
        assert (record.state, record.result) == (JobState.COMPLETED, "ok")
    finally:
        await trio.to_thread.run_sync(beside.close)
