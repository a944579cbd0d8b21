# The cron task record on every driver: a compare-and-set that moves a task's mark and enqueues
# its fires in one transaction, and a fire record that refuses a second fire of the same time.
from __future__ import annotations

import json

import trio

from jobs_trio._core.records import JobState, TaskAdvance, TaskFire, TaskMark
from jobs_trio.driver import Driver
from jobs_trio.drivers._rules import FIRE_HISTORY
from jobs_trio.testing._clock import ManualClock

from .helpers import new_job


def fire(scheduled: float, task: str = "reports.daily") -> TaskFire:
    return TaskFire(scheduled, new_job(task, queue="reports", payload={"scheduled": scheduled}))


def advance(
    expected: float | None, to: float, *fires: float, task: str = "reports.daily"
) -> TaskAdvance:
    return TaskAdvance(task, expected, to, tuple(fire(t, task) for t in fires))


async def fired_times(driver: Driver) -> list[float]:
    jobs = await driver.list_jobs(limit=1000)
    return sorted(json.loads(job.payload)["scheduled"] for job in jobs)


async def test_the_first_advance_creates_the_record_and_a_second_create_is_refused(
    driver: Driver,
) -> None:
    assert await driver.task_marks() == []
    assert await driver.advance_task(advance(None, 100.0)) is True
    assert await driver.task_marks() == [TaskMark("reports.daily", 100.0)]
    # Another worker that also saw no record loses: the record exists now.
    assert await driver.advance_task(advance(None, 130.0, 120.0)) is False
    assert await driver.task_marks() == [TaskMark("reports.daily", 100.0)]
    assert await fired_times(driver) == []


async def test_an_advance_enqueues_its_fires_and_records_the_last(
    driver: Driver, manual_clock: ManualClock
) -> None:
    await driver.advance_task(advance(None, 100.0))
    manual_clock.advance(5)
    assert await driver.advance_task(advance(100.0, 160.0, 120.0, 160.0)) is True
    assert await fired_times(driver) == [120.0, 160.0]
    [mark] = await driver.task_marks()
    last = await driver.get(mark.last_job_id or "")
    assert last is not None and json.loads(last.payload) == {"scheduled": 160.0}
    assert (last.name, last.queue, last.state) == ("reports.daily", "reports", JobState.READY)
    assert mark == TaskMark("reports.daily", 160.0, 160.0, manual_clock.now, last.id)
    # A skip (no fires) moves the mark and keeps what the last fire was.
    assert await driver.advance_task(advance(160.0, 220.0)) is True
    assert await driver.task_marks() == [TaskMark("reports.daily", 220.0, *mark_tail(mark))]


def mark_tail(mark: TaskMark) -> tuple[float | None, float | None, str | None]:
    return (mark.last_fired, mark.last_fired_at, mark.last_job_id)


async def test_a_stale_advance_writes_nothing(driver: Driver) -> None:
    await driver.advance_task(advance(None, 100.0))
    await driver.advance_task(advance(100.0, 120.0, 120.0))
    # A lagging worker that read 100 fires 120 again: refused, and no job is written.
    assert await driver.advance_task(advance(100.0, 120.0, 120.0)) is False
    assert await fired_times(driver) == [120.0]
    assert (await driver.task_marks())[0].handled_until == 120.0


async def test_a_fire_already_on_record_refuses_the_whole_advance(driver: Driver) -> None:
    await driver.advance_task(advance(None, 100.0))
    await driver.advance_task(advance(100.0, 120.0, 120.0))
    # The mark matches, but 120 fired already: nothing of this advance is written, not even
    # the new fire at 180 that came with it.
    assert await driver.advance_task(advance(120.0, 180.0, 120.0, 180.0)) is False
    assert await fired_times(driver) == [120.0]
    assert (await driver.task_marks())[0].handled_until == 120.0


async def test_racing_advances_from_one_mark_fire_once(driver: Driver) -> None:
    await driver.advance_task(advance(None, 100.0))
    results: list[bool] = []

    async def one() -> None:
        results.append(await driver.advance_task(advance(100.0, 120.0, 120.0)))

    async with trio.open_nursery() as nursery:
        for _ in range(5):
            nursery.start_soon(one)
    assert sorted(results) == [False] * 4 + [True]
    assert await fired_times(driver) == [120.0]


async def test_a_created_record_can_fire_at_once_and_tasks_are_apart(driver: Driver) -> None:
    assert await driver.advance_task(advance(None, 60.0, 60.0, task="b.task")) is True
    assert await driver.advance_task(advance(None, 60.0, 60.0, task="a.task")) is True
    marks = await driver.task_marks()
    assert [(m.task, m.handled_until, m.last_fired) for m in marks] == [
        ("a.task", 60.0, 60.0),
        ("b.task", 60.0, 60.0),
    ]
    assert all(m.last_job_id is not None for m in marks)


async def test_the_fire_record_keeps_the_newest_fires(driver: Driver) -> None:
    times = [float(t) for t in range(1, FIRE_HISTORY + 6)]
    await driver.advance_task(advance(None, 0.0))
    await driver.advance_task(advance(0.0, times[-1], *times))
    last = times[-1]
    # The newest FIRE_HISTORY times are on record and refused; older ones were pruned (the
    # mark, which never moves back in a scheduler, is what keeps those from firing again).
    assert await driver.advance_task(advance(last, last, times[-FIRE_HISTORY])) is False
    assert await driver.advance_task(advance(last, last, times[-FIRE_HISTORY - 1])) is True
