# The scheduler on Trio's mock clock: each missed-run policy after the fleet was down, the two
# DST nights, a schedule changed or removed by a deploy, and the worker's drain stopping it.
from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest
import trio
import trio.testing
from prometheus_client import CollectorRegistry

from jobs_trio import Registry
from jobs_trio._core.metrics import Metrics
from jobs_trio._core.records import JobRecord, JobState
from jobs_trio._cron.scheduler import TaskScheduler, fire_now
from jobs_trio._cron.tasks import TaskDefinition
from jobs_trio._run.worker import Worker, open_worker
from jobs_trio.drivers.memory import MemoryDriver

# Mock time 0 is this instant (a Monday, 00:00 UTC), so cron fields read naturally.
EPOCH = dt.datetime(2025, 6, 2, tzinfo=dt.UTC).timestamp()
MINUTE, HOUR, DAY = 60.0, 3600.0, 86400.0


def mock_driver() -> MemoryDriver:
    return MemoryDriver(clock=lambda: EPOCH + trio.current_time())


def metrics() -> Metrics:
    return Metrics(CollectorRegistry())


def declare(registry: Registry, **options: Any) -> TaskDefinition:
    options.setdefault("cron", "0 * * * *")
    return registry.task("reports.hourly", **options)(lambda ctx, payload: payload)


async def fired(driver: MemoryDriver) -> list[float]:
    """The scheduled times (mock seconds) of every fire enqueued, from the jobs' payloads."""
    jobs = await driver.list_jobs(limit=10_000)
    return sorted(json.loads(job.payload)["scheduled_ts"] - EPOCH for job in jobs)


async def run_for(
    driver: MemoryDriver, tasks: list[TaskDefinition], until: float, **options: Any
) -> None:
    """Run one scheduler from now until mock time ``until``."""
    with trio.move_on_at(until):
        async with trio.open_nursery() as nursery:
            await nursery.start(TaskScheduler(driver, tasks, metrics=metrics(), **options).run)


# Missed runs: the fleet runs 00:00-02:30, is down until 07:30, and runs on to 08:30.


@pytest.mark.parametrize(
    ("missed", "after_restart"),
    [
        ("skip", [8 * HOUR]),  # 03:00 to 07:00 skipped; the next time fires on time
        ("latest", [7 * HOUR, 8 * HOUR]),  # 07:00 fires once, as soon as a worker is back
        ("all", [5 * HOUR, 6 * HOUR, 7 * HOUR, 8 * HOUR]),  # catch_up=3: 05, 06 and 07
    ],
)
async def test_each_missed_run_policy_after_the_fleet_was_down(
    autojump_clock: trio.testing.MockClock, missed: str, after_restart: list[float]
) -> None:
    driver = mock_driver()
    task = declare(Registry(), missed=missed, catch_up=3)
    await run_for(driver, [task], 2.5 * HOUR)
    assert await fired(driver) == [HOUR, 2 * HOUR]
    await trio.sleep_until(7.5 * HOUR)
    await run_for(driver, [task], 8.5 * HOUR)
    assert (await fired(driver))[2:] == after_restart
    caught_up = [j for j in await driver.list_jobs() if j.created_at == EPOCH + 7.5 * HOUR]
    assert len(caught_up) == len(after_restart) - 1  # all enqueued at the restart itself


async def test_a_new_task_starts_at_its_next_time_not_in_the_past(
    autojump_clock: trio.testing.MockClock,
) -> None:
    driver = mock_driver()
    await trio.sleep_until(5.5 * HOUR)
    await run_for(driver, [declare(Registry())], 7.5 * HOUR)
    assert await fired(driver) == [6 * HOUR, 7 * HOUR]


async def test_the_payload_carries_the_scheduled_time_in_the_tasks_zone(
    autojump_clock: trio.testing.MockClock,
) -> None:
    driver = mock_driver()
    task = declare(Registry(), cron="0 9 * * *", timezone="Europe/Berlin")
    await run_for(driver, [task], DAY)
    [job] = await driver.list_jobs()
    assert json.loads(job.payload) == {
        "task": "reports.hourly",
        "scheduled_at": "2025-06-02T09:00:00+02:00",
        "scheduled_ts": EPOCH + 7 * HOUR,
    }
    assert (job.name, job.state) == ("reports.hourly", JobState.READY)


# DST: Europe/Berlin, spring forward on 2025-03-30, fall back on 2025-10-26.


@pytest.mark.parametrize(
    ("night", "expected_utc"),
    [
        ((2025, 3, 29), ["2025-03-29T01:30", "2025-03-30T01:00", "2025-03-31T00:30"]),
        ((2025, 10, 25), ["2025-10-25T00:30", "2025-10-26T00:30", "2025-10-27T01:30"]),
    ],
)
async def test_a_daily_0230_fires_once_a_night_across_both_dst_changes(
    autojump_clock: trio.testing.MockClock, night: tuple[int, int, int], expected_utc: list[str]
) -> None:
    start = dt.datetime(*night, tzinfo=dt.UTC).timestamp()
    driver = MemoryDriver(clock=lambda: start + trio.current_time())
    task = declare(Registry(), cron="30 2 * * *", timezone="Europe/Berlin")
    await run_for(driver, [task], 3 * DAY)
    jobs = await driver.list_jobs()
    got = sorted(json.loads(j.payload)["scheduled_ts"] for j in jobs)
    assert [dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%dT%H:%M") for t in got] == (
        expected_utc
    )


# Deploys.


async def test_a_changed_schedule_fires_on_the_new_one_from_the_next_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    driver = mock_driver()
    await run_for(driver, [declare(Registry(), cron="0 9 * * *")], 10 * HOUR)
    assert await fired(driver) == [9 * HOUR]
    # The deploy moves it to 17:00 and 21:00: nothing for the old 09:00, nothing retroactive.
    await run_for(driver, [declare(Registry(), cron="0 17,21 * * *")], DAY + 10 * HOUR)
    assert await fired(driver) == [9 * HOUR, 17 * HOUR, 21 * HOUR]


async def test_a_removed_task_stops_firing_and_its_record_harms_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    driver = mock_driver()
    await run_for(driver, [declare(Registry())], 2.5 * HOUR)
    other = Registry().task("cleanup", cron="30 * * * *")(lambda c, p: None)
    await run_for(driver, [other], 4 * HOUR)
    names = sorted(
        (job.name, json.loads(job.payload)["scheduled_ts"] - EPOCH)
        for job in await driver.list_jobs()
    )
    # cleanup is new at 02:30 sharp: it starts after now, at 03:30.
    assert names == [
        ("cleanup", 3.5 * HOUR),
        ("reports.hourly", HOUR),
        ("reports.hourly", 2 * HOUR),
    ]
    assert [m.task for m in await driver.task_marks()] == ["cleanup", "reports.hourly"]


# Several schedulers: once per fleet.


async def test_three_schedulers_fire_each_time_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    driver = mock_driver()
    task = declare(Registry(), cron="* * * * * *")
    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(run_for, driver, [task], 30.5)
    assert await fired(driver) == [float(t) for t in range(1, 31)]


async def test_fire_now_enqueues_a_manual_fire_and_leaves_the_schedule_alone(
    autojump_clock: trio.testing.MockClock,
) -> None:
    driver = mock_driver()
    task = declare(Registry())
    await run_for(driver, [task], 1.5 * HOUR)
    await fire_now(driver, task)
    await run_for(driver, [task], 2.5 * HOUR)
    payloads = [json.loads(j.payload) for j in await driver.list_jobs()]
    manual = [p for p in payloads if p.get("manual")]
    assert [p["scheduled_ts"] - EPOCH for p in manual] == [1.5 * HOUR]
    assert await fired(driver) == [HOUR, 1.5 * HOUR, 2 * HOUR]


# In the worker.


async def test_a_worker_runs_each_fire_as_an_ordinary_job(
    autojump_clock: trio.testing.MockClock,
) -> None:
    driver = mock_driver()
    registry = Registry()
    seen: list[str] = []

    @registry.task("ping", cron="*/10 * * * * *")
    async def ping(ctx: object, payload: dict[str, Any]) -> None:
        seen.append(payload["scheduled_at"])

    async with open_worker(
        driver, registry, metrics=metrics(), lifecycle=None, stats_interval=None
    ):
        await trio.sleep(35)
    assert seen == [f"2025-06-02T00:00:{s}+00:00" for s in ("10", "20", "30")]
    assert {j.state for j in await driver.list_jobs()} == {JobState.COMPLETED}

    quiet = mock_driver()
    async with open_worker(
        quiet, registry, metrics=metrics(), schedule_tasks=False, stats_interval=None
    ):
        await trio.sleep(35)
    assert await quiet.list_jobs() == []


async def test_the_drain_stops_the_scheduler_at_accept(
    autojump_clock: trio.testing.MockClock,
) -> None:
    driver = mock_driver()
    registry = Registry()
    registry.task("tick", cron="* * * * * *")(lambda ctx, payload: None)
    release = trio.Event()

    @registry.job("slow")
    async def slow(ctx: object, payload: object) -> None:
        # Keeps the teardown waiting well past accept: a scheduler still alive then would go
        # on firing every second.
        with trio.CancelScope(shield=True):
            await release.wait()

    await slow.enqueue(driver)
    async with trio.open_nursery() as nursery:
        worker = Worker(driver, registry, metrics=metrics(), stats_interval=None)
        await nursery.start(worker.run)
        await trio.sleep(5.5)
        worker.accept("test")
        at_accept = len(await fired_by(driver, "tick"))
        try:
            await trio.sleep(10)
            assert len(await fired_by(driver, "tick")) == at_accept
            assert worker.state == "draining"
        finally:
            release.set()  # a failure above must not leave the worker waiting forever
    assert at_accept == 5


async def fired_by(driver: MemoryDriver, name: str) -> list[JobRecord]:
    return [j for j in await driver.list_jobs(limit=1000) if j.name == name]
