# Metrics: jobs_total counts only ok / failed / dead, and the queue gauges follow stats().
# The names, the zero states, the label cap and the slot gauges: tests/ops/test_metrics_names.py.
from __future__ import annotations

import trio
import trio.testing

from jobs_trio import Registry
from jobs_trio._core.metrics import Metrics
from jobs_trio._core.records import DeadLetter
from tests.helpers.worker_helpers import counted, fresh_metrics, trio_driver, worker


def gauge(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(f"jobs_trio_{name}", labels)


async def test_the_worker_publishes_queue_depth_oldest_ready_and_dead(
    autojump_clock: object,
) -> None:
    registry = Registry()

    @registry.job("later", queue="mail")
    async def later(ctx: object, payload: None) -> None: ...

    driver = trio_driver()
    await later.enqueue_many(driver, [None, None, None], delay=100)
    await later.enqueue(driver)
    [claim] = await driver.claim(["mail"], 1, lease=30, worker_id="x")
    await driver.settle([DeadLetter(claim.lease, "gone")])
    await later.enqueue(driver)
    await trio.sleep(7)
    metrics = fresh_metrics()
    # Claims nothing (no queue of its own with due work), observes every 5 s.
    w = worker(driver, registry, queues=["other"], metrics=metrics, stats_interval=5)
    async with trio.open_nursery() as nursery:
        await nursery.start(w.run)
        await trio.testing.wait_all_tasks_blocked()
        await w.stop()
    assert gauge(metrics, "queue_depth", queue="mail", state="ready") == 4
    assert gauge(metrics, "queue_dead_jobs", queue="mail") == 1
    assert gauge(metrics, "queue_oldest_ready_seconds", queue="mail") == 7


async def test_interrupted_and_parked_attempts_are_not_counted_as_failures() -> None:
    registry = Registry()
    started = trio.Event()

    @registry.job("long")
    async def long(ctx: object, payload: None) -> None:
        started.set()
        await trio.sleep_forever()

    driver = trio_driver()
    await long.enqueue(driver)
    metrics = fresh_metrics()
    w = worker(driver, registry, metrics=metrics)
    async with trio.open_nursery() as nursery:
        await nursery.start(w.run)
        await started.wait()
        w.accept("SIGTERM")
        await w.stop()
    assert w.stats().interrupted == 1
    for outcome in ("ok", "failed", "dead"):
        assert counted(metrics, outcome, "long") == 0
    # Counted by its own outcome: a deploy's drains are visible, and apart from failures.
    drained = {"queue": "default", "job": "long", "outcome": "interrupted"}
    assert metrics.registry.get_sample_value("jobs_trio_attempts_total", drained) == 1


async def test_a_paused_queue_has_a_gauge_at_one_and_the_others_none(
    autojump_clock: object,
) -> None:
    registry = Registry()

    @registry.job("later", queue="mail")
    async def later(ctx: object, payload: None) -> None: ...

    driver = trio_driver()
    await later.enqueue(driver)
    await driver.pause_queue("mail")
    await driver.pause_queue("empty")  # paused with no job: observed all the same
    metrics = fresh_metrics()
    w = worker(driver, registry, queues=["other"], metrics=metrics, stats_interval=5)
    async with trio.open_nursery() as nursery:
        await nursery.start(w.run)
        await trio.testing.wait_all_tasks_blocked()
        assert gauge(metrics, "queue_paused", queue="mail") == 1
        assert gauge(metrics, "queue_paused", queue="empty") == 1
        assert gauge(metrics, "queue_paused", queue="other") is None
        await driver.resume_queue("mail")
        await trio.sleep(6)  # past the next observation (every 5 s, mock time)
        assert gauge(metrics, "queue_paused", queue="mail") is None
        await w.stop()
