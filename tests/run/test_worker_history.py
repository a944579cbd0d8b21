# What a worker leaves for operators to read (issue 36): each attempt's record in the job's
# history (its outcome, worker, duration, and the traceback of a failure), and its own presence
# while it runs, taken back when it stops.
from __future__ import annotations

import trio
import trio.testing

from jobs_trio import Backoff, JobContext, Registry, __version__
from tests.helpers.worker_helpers import fresh_metrics, trio_driver, worker


async def test_a_workers_attempts_are_in_the_jobs_history(autojump_clock: object) -> None:
    registry = Registry()

    @registry.job("flaky", attempts=3, backoff=Backoff(base=1, cap=1, jitter=0))
    async def flaky(ctx: JobContext, payload: None) -> str:
        await trio.sleep(2)
        if ctx.attempt == 1:
            raise ValueError("first try fails\non two lines")
        return "ok"

    driver = trio_driver()
    job_id = await flaky.enqueue(driver)
    w = worker(driver, registry, metrics=fresh_metrics(), worker_id="w-history")
    async with trio.open_nursery() as nursery:
        await nursery.start(w.run)
        await trio.sleep(30)
        await w.stop()
    failed, completed = await driver.load_attempts(job_id)
    assert (failed.attempt, failed.outcome, failed.worker_id) == (1, "retried", "w-history")
    assert failed.error == "ValueError: first try fails\non two lines"
    assert failed.traceback is not None
    assert "in flaky" in failed.traceback
    assert failed.traceback.endswith("ValueError: first try fails\non two lines")
    assert failed.seconds == 2
    assert (completed.attempt, completed.outcome, completed.error) == (2, "completed", None)
    assert completed.traceback is None and completed.ended_at > failed.ended_at


async def test_a_running_worker_is_present_and_gone_once_stopped(autojump_clock: object) -> None:
    registry = Registry()
    release = trio.Event()

    @registry.job("held", queue="slow")
    async def held(ctx: JobContext, payload: None) -> None:
        await release.wait()

    driver = trio_driver()
    await held.enqueue(driver)
    w = worker(
        driver, registry, metrics=fresh_metrics(), worker_id="w-seen", concurrency=4,
        stats_interval=15,
    )  # fmt: skip
    async with trio.open_nursery() as nursery:
        await nursery.start(w.run)
        await trio.sleep(16)  # the second announcement: the job is running by then
        [seen] = await driver.workers()
        assert (seen.worker_id, seen.queues, seen.concurrency) == ("w-seen", ("slow",), 4)
        assert (seen.running, seen.state, seen.version) == (1, "running", __version__)
        assert seen.every == 15 and seen.live(driver.now())
        assert seen.seen_at - seen.started_at == 15
        release.set()
        await w.stop()
    assert await driver.workers() == []


async def test_an_attempts_seconds_are_its_bodys_time_whatever_its_timeout(
    autojump_clock: object,
) -> None:
    """The body's time is read from the deadline its run scope set on entry (the clock read
    once): a timeout too long for that float to give the start back reads the clock instead."""
    registry = Registry()

    @registry.job("short", timeout=60)
    async def short(ctx: JobContext, payload: None) -> None:
        await trio.sleep(2)

    @registry.job("endless", timeout=1e300)
    async def endless(ctx: JobContext, payload: None) -> None:
        await trio.sleep(2)

    @registry.job("untimed", timeout=None)
    async def untimed(ctx: JobContext, payload: None) -> None:
        await trio.sleep(2)

    # An uneven time on the clock: a start read back from 0 + timeout would be exact anyway.
    await trio.sleep(1234.5678)
    driver = trio_driver()
    ids = [await job.enqueue(driver) for job in (short, endless, untimed)]
    w = worker(driver, registry, metrics=fresh_metrics())
    async with trio.open_nursery() as nursery:
        await nursery.start(w.run)
        await trio.sleep(30)
        await w.stop()
    for job_id in ids:
        [record] = await driver.load_attempts(job_id)
        assert record.outcome == "completed"
        assert record.seconds is not None and abs(record.seconds - 2) < 1e-6, record


async def test_a_body_that_takes_no_time_reads_zero_seconds_never_less(
    autojump_clock: object,
) -> None:
    """On a mock clock a no-op body takes no time: its start read back from its deadline is a
    float's step off the entry, and its seconds must still read 0, not -1e-15 (found in
    review: the history, the run-seconds histogram and the line all carried the negative)."""
    registry = Registry()

    @registry.job("noop")  # the default timeout, 60 s
    async def noop(ctx: JobContext, payload: None) -> None:
        return None

    await trio.sleep(0.1)  # 0.1 + 60 - 60 is 0.1000000000000014
    driver = trio_driver()
    job_id = await noop.enqueue(driver)
    [outcome] = await worker(driver, registry, metrics=fresh_metrics()).tick()
    [record] = await driver.load_attempts(job_id)
    assert outcome.seconds == 0.0 and record.seconds == 0.0
