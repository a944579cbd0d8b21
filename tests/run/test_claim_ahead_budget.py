# Claims taken ahead (claim_ahead) when a bounded manual stop runs out of budget (3c0b7b4).
from __future__ import annotations

import threading
from typing import Any

import trio
import trio.testing

from jobs_trio import JobContext, JobState, Registry
from jobs_trio._run.worker import Worker
from tests.helpers.worker_helpers import record, worker
from tests.run.test_claim_loop import CountingDriver


async def _thread_has_ended(w: Worker, ended: threading.Event) -> None:
    """Until the abandoned body's thread has ended and Trio has heard it (its slot freed)."""
    await trio.to_thread.run_sync(ended.wait)
    while w._slots.threads.lingering("q"):
        await trio.sleep(0.01)
    await trio.testing.wait_all_tasks_blocked()


async def test_a_budget_cut_stop_leaves_no_held_claim_behind_a_lingering_thread(
    autojump_clock: Any,
) -> None:
    # A manual stop, bounded (bind without a drain), while a sync body holds the only slot and
    # a claim taken ahead waits for it. At the budget the thread is abandoned, but it keeps its
    # slot until it really ends: the held claim was never promoted nor handed back. Before
    # 3c0b7b4 its task was cancelled with the runs nursery and took itself out of _waiting.
    registry = Registry()
    started, release, ended = threading.Event(), threading.Event(), threading.Event()
    ran: list[str] = []

    @registry.job("q.job", queue="q", timeout=10_000)
    def body(ctx: JobContext, payload: str) -> None:
        ran.append(payload)
        started.set()
        try:
            release.wait(30)
        finally:
            ended.set()

    driver = CountingDriver()
    a = await body.enqueue(driver, "a", priority=0)
    b = await body.enqueue(driver, "b", priority=1)
    w = worker(driver, registry, concurrency=1, claim_ahead=1, hold_limit=10_000.0)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(w.run)
            await trio.to_thread.run_sync(started.wait)
            await trio.testing.wait_all_tasks_blocked()
            assert (w.stats().in_flight, w.stats().claimed_ahead) == (1, 1)
            w.bind(trio.current_time() + 1)
            await w.stop()
        assert sorted(w.stats().abandoned) == sorted([a, b])
        # Stopped: nothing is counted any more.
        assert (w.stats().in_flight, w.stats().claimed_ahead) == (0, 0)
    finally:
        release.set()
    # The abandoned thread ends after the worker stopped: its slot frees into nothing.
    await _thread_has_ended(w, ended)
    assert (w.stats().in_flight, w.stats().claimed_ahead) == (0, 0)
    assert ran == ["a"]
    assert (await record(driver, b)).state is JobState.RUNNING  # its lease lapses


async def test_a_held_claim_left_by_a_budget_cut_stop_never_runs_in_the_next_run(
    autojump_clock: Any,
) -> None:
    # As above, then the worker is started again before the abandoned thread ends. The held
    # claim of the first run is still queued for the slot: when the thread ends, it starts in
    # the new run, though the first teardown named it abandoned, nothing renewed its lease
    # since, and another worker has claimed and runs the job: two runs of it at once.
    registry = Registry()
    started, release, ended = threading.Event(), threading.Event(), threading.Event()
    running: dict[str, int] = {}
    most_at_once: dict[str, int] = {}
    gate = trio.Event()

    # One attempt: once its lease lapses, a claim buries it rather than take it again.
    @registry.job("q.stuck", queue="q", timeout=10_000, attempts=1)
    def stuck(ctx: JobContext, payload: None) -> None:
        started.set()
        try:
            release.wait(30)
        finally:
            ended.set()

    # Long timeouts and hold limit throughout: the autojump clock runs on while a thread does.
    @registry.job("q.job", queue="q", timeout=10_000)
    async def job(ctx: JobContext, payload: str) -> None:
        running[payload] = running.get(payload, 0) + 1
        most_at_once[payload] = max(most_at_once.get(payload, 0), running[payload])
        try:
            await gate.wait()
        finally:
            running[payload] -= 1

    driver = CountingDriver()
    await stuck.enqueue(driver, priority=0)
    await job.enqueue(driver, "b", priority=1)
    w = worker(driver, registry, concurrency=1, claim_ahead=1, hold_limit=10_000.0)
    other = worker(driver, registry, concurrency=1, worker_id="other")
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(w.run)
            await trio.to_thread.run_sync(started.wait)
            await trio.testing.wait_all_tasks_blocked()
            assert w.stats().claimed_ahead == 1
            w.bind(trio.current_time() + 1)
            await w.stop()
            await nursery.start(w.run)  # started again; the thread still runs
            await trio.sleep(20)  # b's lease (8 s) lapses: nothing of w renews it
            await nursery.start(other.run)
            await trio.testing.wait_all_tasks_blocked()
            # b is claimed anew, by the other worker (it runs it) or by w (held ahead).
            release.set()
            await _thread_has_ended(w, ended)
            assert most_at_once == {"b": 1}, "b ran twice at once"
            gate.set()
            await w.stop()
            await other.stop()
    finally:
        release.set()


async def test_a_held_claim_left_by_a_budget_cut_stop_is_not_started_by_a_slow_unwind(
    autojump_clock: Any,
) -> None:
    # No thread needed: a body that takes 5 s to unwind keeps the runs nursery open past a
    # manual stop cut by its budget (the worker reads STOPPED meanwhile). The claim it held
    # ahead stays queued for the slot; when the worker is started again within those 5 s, the
    # unwound run's slot hands it to the new run, which runs the body of a claim the first
    # teardown named abandoned and whose lease nothing renews.
    registry = Registry()
    started = trio.Event()
    ran: list[str] = []

    @registry.job("q.job", queue="q")
    async def job(ctx: JobContext, payload: str) -> None:
        ran.append(payload)
        started.set()
        try:
            await trio.sleep_forever()
        finally:
            with trio.CancelScope(shield=True):
                await trio.sleep(5)

    driver = CountingDriver()
    a = await job.enqueue(driver, "a", priority=0)
    b = await job.enqueue(driver, "b", priority=1)
    w = worker(driver, registry, concurrency=1, claim_ahead=1, hold_limit=1000.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(w.run)
        await started.wait()
        await trio.testing.wait_all_tasks_blocked()
        t0 = trio.current_time()
        w.bind(t0)
        await w.stop()
        assert sorted(w.stats().abandoned) == sorted([a, b])
        assert w.stats().claimed_ahead == 0
        await nursery.start(w.run)
        await trio.sleep(6)  # a has unwound; b's first lease (8 s) has not lapsed yet
        assert ran == ["a"]
        await w.stop()
