# The fleet's queue stats (issue 20): one caller per interval reads the table and stores what it
# saw; every other caller within the interval gets that stored observation; stats() stays exact.
from __future__ import annotations

from jobs_trio.driver import Driver
from jobs_trio.testing._clock import ManualClock

from .helpers import enqueue_one


def depth_of(stats: object, queue: str) -> dict[str, int]:
    for q in stats:  # type: ignore[attr-defined]
        if q.queue == queue:
            return dict(q.depth)
    return {}


async def test_one_caller_per_interval_observes_the_others_get_its_observation(
    driver: Driver, manual_clock: ManualClock
) -> None:
    await enqueue_one(driver, queue="a")
    first = await driver.fleet_stats("w1", 15.0)
    assert depth_of(first, "a") == {"ready": 1}

    await enqueue_one(driver, queue="a")
    manual_clock.advance(10)
    # Within the interval: w2 (and w1 again) get w1's stored observation, not a new read.
    assert await driver.fleet_stats("w2", 15.0) == first
    assert await driver.fleet_stats("w1", 15.0) == first
    # The operator's read is exact whatever the fleet's observation says.
    assert depth_of(await driver.stats(), "a") == {"ready": 2}

    manual_clock.advance(5)  # 15 s since w1's turn: the next caller takes the turn
    second = await driver.fleet_stats("w2", 15.0)
    assert depth_of(second, "a") == {"ready": 2}
    assert await driver.fleet_stats("w1", 15.0) == second
