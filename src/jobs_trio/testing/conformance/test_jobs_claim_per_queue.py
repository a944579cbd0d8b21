# One claim for all of a worker's queues, each capped at its own free slots (issue 20): a deep
# queue of better jobs never takes another queue's slots, and lapsed jobs count against the cap.
from __future__ import annotations

from collections import Counter

import pytest

from jobs_trio._core.records import JobState
from jobs_trio.driver import Driver
from jobs_trio.testing._clock import ManualClock

from .helpers import enqueue_one


# Every claim below with and without rescue (a worker's claims between its rescues take no lapsed
# job, claim_loop.RESCUE_EVERY: a statement of its own on PostgreSQL) answers alike.
@pytest.mark.parametrize("rescue", [True, False])
async def test_a_mapping_limit_caps_each_queue_on_its_own(
    driver: Driver, manual_clock: ManualClock, rescue: bool
) -> None:
    deep = []
    for _ in range(5):
        deep.append(await enqueue_one(driver, queue="deep", priority=0))
        manual_clock.advance(1)
    shallow = [await enqueue_one(driver, queue="shallow", priority=9) for _ in range(2)]
    other = await enqueue_one(driver, queue="other", priority=0)

    claims = await driver.claim(
        ["deep", "shallow", "other"],
        {"deep": 2, "shallow": 3},
        lease=10,
        worker_id="w",
        rescue=rescue,
    )

    # With one total of 5, best first, the deep queue's better jobs would have taken all five.
    assert Counter(c.queue for c in claims) == {"deep": 2, "shallow": 2}
    assert sorted(c.job_id for c in claims if c.queue == "deep") == sorted(deep[:2])
    assert sorted(c.job_id for c in claims if c.queue == "shallow") == sorted(shallow)
    record = await driver.get(other)
    assert record is not None and record.state is JobState.READY  # not named: takes none


async def test_lapsed_jobs_count_against_their_queues_cap(
    driver: Driver, manual_clock: ManualClock
) -> None:
    lapsed = [await enqueue_one(driver, queue="a") for _ in range(2)]
    assert len(await driver.claim(["a"], 2, lease=5, worker_id="dies")) == 2
    manual_clock.advance(1)
    ready_a = await enqueue_one(driver, queue="a")
    ready_b = []
    for _ in range(3):
        ready_b.append(await enqueue_one(driver, queue="b"))
        manual_clock.advance(1)  # b's jobs in run-at order, not by their random ids
    manual_clock.advance(7)  # both lapsed; they sort before the ready job (earlier run-at)

    claims = await driver.claim(["a", "b"], {"a": 2, "b": 1}, lease=10, worker_id="w")

    assert sorted(c.job_id for c in claims if c.queue == "a") == sorted(lapsed)
    assert [c.job_id for c in claims if c.queue == "b"] == [ready_b[0]]
    record = await driver.get(ready_a)
    assert record is not None and record.state is JobState.READY


async def test_a_mapping_with_no_free_slot_claims_nothing(driver: Driver) -> None:
    await enqueue_one(driver, queue="a")
    assert await driver.claim(["a"], {"a": 0}, lease=10, worker_id="w") == []
    assert await driver.claim(["a"], {}, lease=10, worker_id="w") == []


@pytest.mark.parametrize("rescue", [True, False])
async def test_a_claim_over_three_hundred_queues_takes_their_jobs_in_claim_order(
    driver: Driver, manual_clock: ManualClock, rescue: bool
) -> None:
    # A worker may serve hundreds of queues (a queue a tenant): one claim names them all. SQLite
    # reads them in parts (a statement compounds at most 500 reads), and the parts' rows are
    # ranked again as one read ranks them: priority, then run-at, then id, across queues.
    queues = [f"tenant-{n}" for n in range(300)]
    ids = {}
    for n in (299, 0, 150, 101, 100, 250):
        ids[n] = await enqueue_one(driver, queue=queues[n], priority=0 if n == 250 else 1)
        manual_clock.advance(1)

    claims = await driver.claim(queues, 5, lease=10, worker_id="w", rescue=rescue)

    assert [c.job_id for c in claims] == [ids[n] for n in (250, 299, 0, 150, 101)]
    assert [c.queue for c in claims] == [queues[n] for n in (250, 299, 0, 150, 101)]


async def test_a_limit_far_past_the_jobs_due_takes_what_is_due(driver: Driver) -> None:
    # A limit is a cap, never a size to prepare for: SQLite made a token for every job the limit
    # allowed (2**31 - 1 of them: 25 GB of random bytes, a MemoryError) before taking three.
    ids = [await enqueue_one(driver) for _ in range(3)]
    claims = await driver.claim(["default"], 2**31 - 1, lease=10, worker_id="w")
    assert sorted(c.job_id for c in claims) == sorted(ids)
    assert len({c.token for c in claims}) == 3
