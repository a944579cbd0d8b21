# The outbox half of the driver contract (outbox_write / claim / delete / stats) and the relay's
# enqueue_once, on every driver: what the relay's exactly-once rests on.
from __future__ import annotations

from jobs_trio.driver import Driver
from jobs_trio.records import JobState
from jobs_trio.testing.clock import ManualClock

from .helpers import new_job


async def test_outbox_rows_are_claimed_oldest_first_with_what_remains_of_their_delay(
    driver: Driver, manual_clock: ManualClock
) -> None:
    first, second = new_job(payload={"n": 1}, delay=10.0, key="k1"), new_job(payload={"n": 2})
    await driver.outbox_write([first, second])
    manual_clock.advance(4.0)
    taken = await driver.outbox_claim(10, lease=30.0, relay_id="r1")
    assert [j.job_id for j in taken] == [first.job_id, second.job_id]
    assert taken[0].delay == 6.0 and taken[1].delay == 0.0
    assert (taken[0].key, taken[0].payload, taken[0].name) == ("k1", first.payload, first.name)
    assert taken[0].max_attempts == first.max_attempts


async def test_a_held_row_is_skipped_until_its_lease_lapses(
    driver: Driver, manual_clock: ManualClock
) -> None:
    rows = [new_job(payload={"n": n}) for n in range(3)]
    await driver.outbox_write(rows)
    first = await driver.outbox_claim(2, lease=30.0, relay_id="r1")
    second = await driver.outbox_claim(10, lease=30.0, relay_id="r2")
    assert [j.job_id for j in first] == [rows[0].job_id, rows[1].job_id]
    assert [j.job_id for j in second] == [rows[2].job_id]
    assert await driver.outbox_claim(10, lease=30.0, relay_id="r3") == []
    manual_clock.advance(30.0)  # r1 and r2 died holding them: their rows come back
    again = await driver.outbox_claim(10, lease=30.0, relay_id="r3")
    assert [j.job_id for j in again] == [r.job_id for r in rows]


async def test_delete_and_stats(driver: Driver, manual_clock: ManualClock) -> None:
    empty = await driver.outbox_stats()
    assert (empty.pending, empty.oldest_age) == (0, None)
    rows = [new_job(), new_job()]
    await driver.outbox_write(rows[:1])
    manual_clock.advance(5.0)
    await driver.outbox_write(rows[1:])
    manual_clock.advance(2.0)
    stats = await driver.outbox_stats()
    assert (stats.pending, stats.oldest_age) == (2, 7.0)
    assert await driver.outbox_delete([rows[0].job_id, "no-such-id"]) == 1
    assert await driver.outbox_delete([rows[0].job_id]) == 0
    stats = await driver.outbox_stats()
    assert (stats.pending, stats.oldest_age) == (1, 2.0)


async def test_enqueue_once_writes_an_id_once_even_after_the_job_finished(
    driver: Driver,
) -> None:
    job = new_job(payload={"n": 1})
    [first] = await driver.enqueue_once([job])
    assert (first.job_id, first.created) == (job.job_id, True)
    [again] = await driver.enqueue_once([job])
    assert (again.job_id, again.created) == (job.job_id, False)
    claims = await driver.claim(["default"], 10, lease=30.0, worker_id="w")
    assert [c.job_id for c in claims] == [job.job_id]
    from jobs_trio.records import Complete

    await driver.settle([Complete(claims[0].lease)])
    # Finished, so no live key or state protects it: only the id does.
    [late] = await driver.enqueue_once([job])
    assert late.created is False
    record = await driver.get(job.job_id)
    assert record is not None and record.state is JobState.COMPLETED
    assert len(await driver.list_jobs()) == 1


async def test_enqueue_once_applies_unique_keys_and_delays(
    driver: Driver, manual_clock: ManualClock
) -> None:
    holder = new_job(key="order:1")
    await driver.enqueue([holder])
    keyed, delayed = new_job(key="order:1"), new_job(delay=30.0)
    answers = await driver.enqueue_once([keyed, delayed])
    assert [(a.job_id, a.created) for a in answers] == [
        (holder.job_id, False),
        (delayed.job_id, True),
    ]
    assert await driver.get(keyed.job_id) is None
    record = await driver.get(delayed.job_id)
    assert record is not None and record.run_at == manual_clock.now + 30.0
    # A batch mixing a stored id, a held key and a new job answers each in order.
    fresh = new_job()
    answers = await driver.enqueue_once([delayed, keyed, fresh])
    assert [(a.job_id, a.created) for a in answers] == [
        (delayed.job_id, False),
        (holder.job_id, False),
        (fresh.job_id, True),
    ]
