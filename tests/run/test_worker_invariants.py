# DESIGN's invariants 3-8 and 10, each as a test on the memory driver and Trio's mock clock.
from __future__ import annotations

import math

import pytest
import trio
import trio.testing

from jobs_trio import DuplicateJob, Registry
from jobs_trio._core.records import JobState
from tests.helpers.worker_helpers import record, trio_driver, worker


async def test_3_fencing_a_worker_that_lost_its_lease_cannot_overwrite_the_next(
    autojump_clock: object,
) -> None:
    registry = Registry()
    release = trio.Event()

    @registry.job("slowpoke", timeout=None)
    async def slowpoke(ctx: object, payload: None) -> str:
        with trio.CancelScope(shield=True):  # deaf to its lease-lost cancel
            await release.wait()
        return "stale"

    driver = trio_driver()
    job_id = await slowpoke.enqueue(driver)
    # One slot, held by the deaf run: the first worker cannot re-claim the job itself.
    first = worker(driver, registry, lease=30, concurrency=1)
    async with trio.open_nursery() as nursery:
        await nursery.start(first.run)
        await trio.testing.wait_all_tasks_blocked()
        try:
            # The first worker's renewals stop reaching the database; its lease lapses.
            driver._tokens[job_id] = "lapsed"
            await trio.sleep(31)
            [takeover] = await driver.claim(["default"], 1, lease=30, worker_id="second")
        finally:
            release.set()
        await first.stop()
    # It returned, so it is judged completed, and its write carried its own (stale) token.
    assert first.stats().outcomes["completed"] == 1
    r = await record(driver, job_id)
    assert r.state is JobState.RUNNING and r.worker_id == "second" and r.result is None
    from jobs_trio._core.records import Complete

    assert await driver.settle([Complete(takeover.lease, '"fresh"')]) == [job_id]


async def test_4_a_timeout_that_fired_before_the_drain_reports_as_a_timeout(
    autojump_clock: object,
) -> None:
    registry = Registry()
    cleaning = trio.Event()

    @registry.job("cleanup", timeout=5, attempts=3)
    async def cleanup(ctx: object, payload: None) -> None:
        try:
            await trio.sleep(60)
        finally:
            with trio.CancelScope(shield=True):
                cleaning.set()
                await trio.sleep(10)  # the drain lands while it cleans up

    driver = trio_driver()
    job_id = await cleanup.enqueue(driver)
    w = worker(driver, registry)
    async with trio.open_nursery() as nursery:
        await nursery.start(w.run)
        await cleaning.wait()
        w.accept("SIGTERM")
        await w.stop()
    r = await record(driver, job_id)
    assert "JOB_TIMEOUT" in (r.last_error or "")
    assert r.attempts == 1  # a timeout counts; a drain would have handed it back
    assert w.stats().outcomes["retried"] == 1 and w.stats().interrupted == 0


async def test_5_every_held_run_is_told_at_once_and_interrupted(autojump_clock: object) -> None:
    registry = Registry()
    started: list[str] = []

    @registry.job("sleepy", attempts=1)
    async def sleepy(ctx: object, payload: int) -> None:
        started.append(ctx.job_id)  # type: ignore[attr-defined]
        await trio.sleep(math.inf)

    driver = trio_driver()
    ids = await sleepy.enqueue_many(driver, range(5))
    w = worker(driver, registry, concurrency=5)
    async with trio.open_nursery() as nursery:
        await nursery.start(w.run)
        await trio.testing.wait_all_tasks_blocked()
        assert len(started) == 5
        t0 = trio.current_time()
        w.accept("SIGTERM")
        w.bind(t0 + 25)
        await w.stop()
        assert trio.current_time() == t0  # nobody waited on a job that could stop
    for job_id in ids:
        r = await record(driver, job_id)
        assert r.state is JobState.READY and r.attempts == 0
    claims = await driver.claim(["default"], 10, lease=30, worker_id="next")
    assert sorted(c.job_id for c in claims) == sorted(ids)


async def test_6_a_worker_reaches_stopped_past_a_body_that_ignores_cancellation(
    autojump_clock: object,
) -> None:
    registry = Registry()
    let_go = trio.Event()

    @registry.job("deaf", timeout=None)
    async def deaf(ctx: object, payload: None) -> None:
        with trio.CancelScope(shield=True):
            await let_go.wait()

    @registry.job("polite", timeout=None)
    async def polite(ctx: object, payload: None) -> None:
        await trio.sleep(math.inf)

    driver = trio_driver()
    deaf_id = await deaf.enqueue(driver)
    await polite.enqueue(driver)
    w = worker(driver, registry)
    async with trio.open_nursery() as nursery:
        await nursery.start(w.run)
        await trio.testing.wait_all_tasks_blocked()
        t0 = trio.current_time()
        w.accept("SIGTERM")
        w.bind(t0 + 25)
        await w.stop()
        assert w.state == "stopped"
        assert trio.current_time() == pytest.approx(t0 + 25)
        assert w.stats().abandoned == (deaf_id,)
        await w.stop()  # idempotent
        let_go.set()  # lets the test's nursery close; a real process is ended instead
    assert (await record(driver, deaf_id)).state is JobState.RUNNING  # its lease will lapse


async def test_6_stop_joins_a_teardown_in_progress(autojump_clock: object) -> None:
    registry = Registry()

    @registry.job("tenner", timeout=None)
    async def tenner(ctx: object, payload: None) -> None:
        await trio.sleep(10)

    driver = trio_driver()
    await tenner.enqueue(driver)
    w = worker(driver, registry)
    ended: list[float] = []

    async def stopper() -> None:
        await w.stop()
        ended.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        await nursery.start(w.run)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(stopper)
        nursery.start_soon(stopper)
    assert len(ended) == 2 and ended[0] == ended[1] == pytest.approx(10)


async def test_7_manual_stop_waits_unbounded_until_a_shutdown_binds_the_budget(
    autojump_clock: object,
) -> None:
    registry = Registry()

    @registry.job("hour", timeout=None)
    async def hour(ctx: object, payload: None) -> None:
        with trio.CancelScope(shield=True):
            await trio.sleep(3600)

    driver = trio_driver()
    await hour.enqueue(driver)
    w = worker(driver, registry)
    async with trio.open_nursery() as nursery:
        await nursery.start(w.run)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(w.stop)
        await trio.sleep(600)
        assert w.state == "draining"  # a manual stop cancels nothing and waits
        w.bind(trio.current_time() + 100)
        w.bind(trio.current_time() + 500)  # a later, looser bind does not extend it
        await w.stop()
        assert trio.current_time() == pytest.approx(700)
        assert w.state == "stopped"


async def test_8_restart_after_a_drain_gets_a_fresh_drain_and_budget(
    autojump_clock: object,
) -> None:
    registry = Registry()

    @registry.job("step", timeout=None)
    async def step(ctx: object, payload: int) -> int:
        await trio.sleep(payload)
        return payload

    driver = trio_driver()
    w = worker(driver, registry)
    async with trio.open_nursery() as nursery:
        await nursery.start(w.run)
        first = await step.enqueue(driver, 1)
        await trio.testing.wait_all_tasks_blocked()
        w.accept("SIGTERM")
        w.bind(trio.current_time() + 1)
        await w.stop()
        assert (await record(driver, first)).state is JobState.READY
        await trio.sleep(2)  # the old budget's deadline is now in the past
        await nursery.start(w.run)  # the same worker again
        second = await step.enqueue(driver, 10)
        await trio.testing.wait_all_tasks_blocked()
        # Born-cancelled runs (a reused drain) would be interrupted at once; a reused budget
        # would abandon the 10 s job at this manual stop instead of waiting for it.
        await w.stop()
    assert (await record(driver, first)).state is JobState.COMPLETED
    assert (await record(driver, second)).state is JobState.COMPLETED
    assert w.stats().outcomes["completed"] == 2 and w.stats().interrupted == 1


async def test_10_two_enqueues_with_one_live_key_yield_one_job() -> None:
    registry = Registry()

    @registry.job("welcome")
    async def welcome(ctx: object, payload: dict[str, int]) -> None:
        pass

    driver = trio_driver()
    a = await welcome.enqueue(driver, {"user": 42}, key="welcome:42")
    b = await welcome.enqueue(driver, {"user": 42}, key="welcome:42")
    assert a == b
    with pytest.raises(DuplicateJob) as caught:
        await welcome.enqueue(driver, {"user": 42}, key="welcome:42", on_duplicate="raise")
    assert caught.value.existing_id == a and caught.value.code == "X_DUPLICATE"
    assert len(await driver.list_jobs()) == 1
