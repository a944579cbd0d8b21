# The metrics as a Prometheus user reads them (issue 36): every name prefixed jobs_trio_, no
# `_created` series, every state of a queue present at 0, a worker's running and free slots,
# the wait from due to start, drained attempts counted, the queue label bounded, and the outbox
# gauges only where a relay observes an outbox. Scraped in a real process: test_metrics_process.
from __future__ import annotations

import trio
import trio.testing
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from jobs_trio import Registry
from jobs_trio._core.metrics import MAX_QUEUE_LABELS, OTHER_QUEUES, Metrics
from jobs_trio._core.records import JobState, OutboxStats, QueueStats
from tests.helpers.worker_helpers import fresh_metrics, trio_driver, worker


def samples(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    scraped = generate_latest(metrics.registry).decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(scraped)
        for sample in family.samples
    }


def value(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(f"jobs_trio_{name}", labels)


async def test_names_are_prefixed_and_there_is_no_created_series(autojump_clock: object) -> None:
    registry = Registry()

    @registry.job("mail.send", queue="mail")
    async def send(ctx: object, payload: None) -> None: ...

    driver = trio_driver()
    await send.enqueue(driver)
    metrics = fresh_metrics()
    w = worker(driver, registry, metrics=metrics, stats_interval=5)
    metrics.task_fired("nightly")
    async with trio.open_nursery() as nursery:
        await nursery.start(w.run)
        await trio.sleep(1)
        names = {name for name, _ in samples(metrics)}
        await w.stop()
    assert names, "nothing scraped"
    assert all(name.startswith("jobs_trio_") for name in names), sorted(names)
    assert not [name for name in names if name.endswith("_created")], sorted(names)
    # A worker that runs no relay exports no outbox gauges (they read as "keeping up").
    assert not [name for name in names if "outbox" in name]
    # The counters a rate() is taken over exist at 0 for every declared job and outcome.
    for outcome in ("ok", "failed", "dead"):
        labels = {"queue": "mail", "job": "mail.send", "outcome": outcome}
        assert value(metrics, "jobs_total", **labels) == (1 if outcome == "ok" else 0)


async def test_every_state_of_a_queue_is_present_at_zero(autojump_clock: object) -> None:
    registry = Registry()

    @registry.job("mail.send", queue="mail")
    async def send(ctx: object, payload: None) -> None: ...

    @registry.job("idle.job", queue="idle")
    async def idle(ctx: object, payload: None) -> None: ...

    driver = trio_driver()
    await send.enqueue(driver, delay=60)
    metrics = fresh_metrics()
    w = worker(driver, registry, metrics=metrics, stats_interval=5)
    async with trio.open_nursery() as nursery:
        await nursery.start(w.run)
        await trio.sleep(1)
        for state in JobState:
            expected = 1 if state is JobState.READY else 0
            assert value(metrics, "queue_depth", queue="mail", state=state.value) == expected
            # A queue the worker claims from that holds no job at all: still every state, 0.
            assert value(metrics, "queue_depth", queue="idle", state=state.value) == 0
        assert value(metrics, "queue_dead_jobs", queue="idle") == 0
        await w.stop()


async def test_running_and_free_slots_follow_the_workers_runs() -> None:
    registry = Registry()
    release = trio.Event()
    started = 0

    @registry.job("long", queue="work")
    async def long(ctx: object, payload: None) -> None:
        nonlocal started
        started += 1
        await release.wait()

    driver = trio_driver()
    await long.enqueue_many(driver, [None, None, None])
    metrics = fresh_metrics()
    w = worker(driver, registry, metrics=metrics, concurrency=5, stats_interval=None)
    assert value(metrics, "running", queue="work") is None  # not started: no series
    async with trio.open_nursery() as nursery:
        await nursery.start(w.run)
        while started < 3:
            await trio.testing.wait_all_tasks_blocked()
        assert value(metrics, "running", queue="work") == 3
        assert value(metrics, "free_slots", queue="work") == 2
        release.set()
        await w.stop()
    # Stopped, the worker's series are gone: no stale "3 running" from a worker long gone.
    assert value(metrics, "running", queue="work") is None


async def test_the_wait_from_due_to_start_is_observed(autojump_clock: object) -> None:
    registry = Registry()

    @registry.job("mail.send", queue="mail")
    async def send(ctx: object, payload: None) -> None: ...

    driver = trio_driver()
    await send.enqueue(driver)  # due now
    await send.enqueue(driver, delay=30)  # due in 30 s: its wait starts then, not now
    await trio.sleep(20)  # nothing runs it for 20 s
    metrics = fresh_metrics()
    w = worker(driver, registry, metrics=metrics, stats_interval=None)
    async with trio.open_nursery() as nursery:
        await nursery.start(w.run)
        await trio.sleep(60)
        await w.stop()
    assert value(metrics, "wait_seconds_count", queue="mail") == 2
    # 20 s for the first; the second started the moment it was due (0 s, the mock clock).
    assert value(metrics, "wait_seconds_sum", queue="mail") == 20
    assert value(metrics, "wait_seconds_bucket", queue="mail", le="10.0") == 1


def test_the_queue_label_is_capped_and_the_rest_summed() -> None:
    metrics = fresh_metrics()
    metrics.watch_slots("w1", lambda: {"q00123": (0, 4)})  # claimed from here: always labelled
    many = [QueueStats(f"q{n:05}", {"ready": 2, "dead": 1}, 1, float(n), 1) for n in range(10_000)]
    metrics.queues_observed(many)
    scraped = samples(metrics)
    depth = {dict(labels)["queue"] for name, labels in scraped if name.endswith("queue_depth")}
    assert len(depth) == MAX_QUEUE_LABELS + 1 and OTHER_QUEUES in depth
    assert "q00123" in depth and "q00000" in depth and "q09999" not in depth
    ready = sum(
        v
        for (name, labels), v in scraped.items()
        if name == "jobs_trio_queue_depth" and dict(labels)["state"] == "ready"
    )
    assert ready == 20_000  # summed, not dropped: the fleet's total still adds up
    assert value(metrics, "queue_oldest_ready_seconds", queue=OTHER_QUEUES) == 9999
    assert len(scraped) < 1_000


def test_the_outbox_gauges_appear_once_a_relay_observes_an_outbox() -> None:
    metrics = fresh_metrics()
    assert not [name for name, _ in samples(metrics) if "outbox" in name]
    metrics.outbox_observed(OutboxStats(pending=3, oldest_age=1.5))
    assert value(metrics, "outbox_pending") == 3
    assert value(metrics, "outbox_oldest_seconds") == 1.5
