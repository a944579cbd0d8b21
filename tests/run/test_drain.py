# The drain as DESIGN states it: a body that returns completes, one that unwinds is interrupted;
# sync bodies are waited for under the budget and abandoned only at it; the claim in flight is
# under the budget too, and a claim that commits after the drain is reached by it.
from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

import pytest
import trio
import trio.testing

from jobs_trio import JobContext, Registry
from jobs_trio._core.errors import AttemptCancelled, JobDrained, JobsError
from jobs_trio._core.records import Claim, JobState
from jobs_trio._run.lifecycle import open_lifecycle
from jobs_trio._run.run_scope import RunScope
from jobs_trio._run.thread_slots import ThreadSlots
from jobs_trio.drivers.memory import MemoryDriver
from tests.helpers.worker_helpers import record, trio_driver, worker


async def _wait_in_thread(event: threading.Event) -> None:
    await trio.to_thread.run_sync(event.wait)


async def test_a_body_that_returns_in_a_shield_after_the_drain_completes(
    autojump_clock: object,
) -> None:
    registry = Registry()
    started = trio.Event()

    @registry.job("finish", attempts=1)
    async def finish(ctx: JobContext, payload: None) -> dict[str, Any]:
        started.set()
        with trio.CancelScope(shield=True):  # its last step: runs to the end whatever comes
            await trio.sleep(1)
        assert isinstance(ctx.cancel_reason, JobDrained)
        return {"done": True}

    driver = trio_driver()
    job_id = await finish.enqueue(driver)
    w = worker(driver, registry)
    async with trio.open_nursery() as nursery:
        await nursery.start(w.run)
        await started.wait()
        w.accept("SIGTERM")
        w.bind(trio.current_time() + 25)
        await w.stop()
    r = await record(driver, job_id)
    assert (r.state, r.attempts, r.result) == (JobState.COMPLETED, 1, {"done": True})
    assert w.stats().outcomes["completed"] == 1 and w.stats().interrupted == 0


async def test_the_drain_reason_is_typed_and_check_cancelled_cannot_be_swallowed() -> None:
    registry = Registry()
    started = trio.Event()
    seen: list[JobsError | None] = []
    raised: list[BaseException] = []

    @registry.job("reads")
    async def reads(ctx: JobContext, payload: None) -> None:
        assert ctx.cancel_reason is None
        started.set()
        try:
            await trio.sleep_forever()
        finally:
            seen.append(ctx.cancel_reason)
            try:
                ctx.check_cancelled()
            except Exception as exc:  # what a careless body writes: must not catch it
                raised.append(exc)
            except AttemptCancelled as exc:
                raised.append(exc)

    driver = trio_driver()
    job_id = await reads.enqueue(driver)
    w = worker(driver, registry, worker_id="w-7")
    async with trio.open_nursery() as nursery:
        await nursery.start(w.run)
        await started.wait()
        w.accept("SIGTERM")
        await w.stop()
    [reason] = seen
    assert isinstance(reason, JobDrained)
    assert (reason.code, reason.worker, reason.signal) == ("X_DRAINING", "w-7", "SIGTERM")
    [stopped] = raised
    assert isinstance(stopped, AttemptCancelled) and stopped.reason is reason
    r = await record(driver, job_id)
    assert r.state is JobState.READY and r.attempts == 0
    assert r.last_error is not None
    assert r.last_error.startswith(
        "JobDrained: [X_DRAINING] interrupted: worker 'w-7' is draining (SIGTERM)"
    )


async def test_a_sync_body_is_waited_for_under_the_drain_and_completes() -> None:
    registry = Registry()
    started, release = threading.Event(), threading.Event()

    @registry.job("crunch", attempts=1)
    def crunch(ctx: JobContext, payload: None) -> dict[str, bool]:
        started.set()
        release.wait(30)  # never polls its cancel
        return {"done": True}

    driver = trio_driver()
    job_id = await crunch.enqueue(driver)
    w = worker(driver, registry)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(w.run)
            await _wait_in_thread(started)
            w.accept("SIGTERM")
            w.bind(trio.current_time() + 25)
            nursery.start_soon(w.stop)
            await trio.testing.wait_all_tasks_blocked()
            # Never handed back while its body runs: that would be two runs at once.
            assert (await record(driver, job_id)).state is JobState.RUNNING
            assert w.state == "draining"
            release.set()
    finally:
        release.set()
    r = await record(driver, job_id)
    assert (r.state, r.attempts, r.result) == (JobState.COMPLETED, 1, {"done": True})


async def test_a_sync_body_past_the_budget_is_abandoned_not_handed_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    registry = Registry()
    started, release, ended = threading.Event(), threading.Event(), threading.Event()

    @registry.job("stubborn")
    def stubborn(ctx: JobContext, payload: None) -> None:
        started.set()
        try:
            release.wait(30)
        finally:
            ended.set()

    driver = trio_driver()
    job_id = await stubborn.enqueue(driver)
    w = worker(driver, registry, concurrency=1)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(w.run)
            await _wait_in_thread(started)
            w.accept("SIGTERM")
            w.bind(trio.current_time() + 0.2)
            with trio.fail_after(5):
                await w.stop()
            assert w.stats().abandoned == (job_id,)
            # Not ready, not interrupted: its lease lapses and it runs again (at-least-once).
            r = await record(driver, job_id)
            assert r.state is JobState.RUNNING and r.attempts == 1
            assert "jobs.worker.drain-abandoned" in caplog.text
            # Its thread still runs: it keeps its slot until it ends.
            assert w._slots.threads.lingering("default") == 1
            release.set()
            await _wait_in_thread(ended)
            with trio.fail_after(5):
                while w._slots.threads.lingering("default"):
                    await trio.sleep(0.01)  # the thread's end reaches Trio by run_sync_soon
    finally:
        release.set()


class ClaimsInFlight(MemoryDriver):
    """A claim that commits, then takes ``gate`` to come back (a slow network, a stalled
    database): the window where a drain can land between the commit and the worker."""

    def __init__(self) -> None:
        super().__init__(clock=trio.current_time)
        self.gate = trio.Event()
        self.committed = trio.Event()

    async def claim(
        self, queues: Any, limit: int, *, lease: float, worker_id: str, **ahead: Any
    ) -> Any:
        claims = await super().claim(queues, limit, lease=lease, worker_id=worker_id, **ahead)
        if claims:
            self.committed.set()
            await self.gate.wait()
        return claims


async def test_a_claim_in_flight_is_waited_for_under_the_budget_only(
    autojump_clock: object,
) -> None:
    registry = Registry()

    @registry.job("any")
    async def any_job(ctx: JobContext, payload: None) -> None:
        pass

    driver = ClaimsInFlight()
    job_id = await any_job.enqueue(driver)
    w = worker(driver, registry, lease=60)
    async with trio.open_nursery() as nursery:
        await nursery.start(w.run)
        await driver.committed.wait()
        t0 = trio.current_time()
        w.accept("SIGTERM")
        w.bind(t0 + 2)
        await w.stop()
        assert trio.current_time() - t0 == pytest.approx(2)  # not the claim's own 30 s or more
    # Committed but never reached: its lease lapses and it is claimed again (at-least-once).
    assert (await record(driver, job_id)).state is JobState.RUNNING


async def test_a_claim_that_commits_after_the_drain_is_interrupted_and_handed_back(
    autojump_clock: object,
) -> None:
    registry = Registry()
    ran: list[str] = []

    @registry.job("late", attempts=1)
    async def late(ctx: JobContext, payload: None) -> None:
        ran.append(ctx.job_id)

    driver = ClaimsInFlight()
    job_id = await late.enqueue(driver)
    w = worker(driver, registry)
    async with trio.open_nursery() as nursery:
        await nursery.start(w.run)
        await driver.committed.wait()
        w.accept("SIGTERM")
        w.bind(trio.current_time() + 25)
        nursery.start_soon(w.stop)
        await trio.sleep(1)
        driver.gate.set()  # the claim comes back after the drain
    assert ran == []  # never started: handed back at once
    r = await record(driver, job_id)
    assert (r.state, r.attempts) == (JobState.READY, 0)
    assert r.last_error is not None and "X_DRAINING" in r.last_error
    assert w.stats().interrupted == 1


async def test_hung_sync_bodies_keep_only_their_own_slots() -> None:
    """40 sync bodies hung past their timeout: with Trio's default thread limiter (40) a quick
    sync job then waited for a thread and "timed out" without running."""
    registry = Registry()
    release = threading.Event()
    done = trio.Event()

    @registry.job("hang", queue="hang", timeout=0.2, attempts=1)
    def hang(ctx: JobContext, payload: int) -> None:
        release.wait(60)

    @registry.job("quick", queue="quick", timeout=2, attempts=1)
    def quick(ctx: JobContext, payload: None) -> str:
        return "ran"

    driver = trio_driver()
    await hang.enqueue_many(driver, list(range(40)))
    w = worker(driver, registry, concurrency={"hang": 40, "quick": 10}, poll_interval=0.05)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(w.run)
            with trio.fail_after(10):
                while w.stats().outcomes["dead-lettered"] < 40:
                    await trio.sleep(0.05)
            assert w._slots.threads.lingering("hang") == 40  # each still holds its own slot
            job_id = await quick.enqueue(driver)
            with trio.fail_after(10):
                while (await record(driver, job_id)).state not in (
                    JobState.COMPLETED,
                    JobState.DEAD,
                ):
                    await trio.sleep(0.05)
            r = await record(driver, job_id)
            assert (r.state, r.result) == (JobState.COMPLETED, "ran"), r.last_error
            done.set()
            w.accept("test over")
            w.bind(trio.current_time())
            await w.stop()
    finally:
        release.set()


def _claim(job_id: str) -> Claim:
    return Claim(job_id, f"t-{job_id}", "j", "q", "null", 1, 3, 0.0)


async def test_a_timeout_counts_from_when_the_body_starts(mock_clock: Any) -> None:
    """A body waiting for a thread is not yet running: its timeout has not started."""
    slots = ThreadSlots({"default": 1}, lambda: None)
    first, second = RunScope(_claim("a"), None), RunScope(_claim("b"), timeout=1.0)
    started, release = threading.Event(), threading.Event()
    answers: list[str] = []

    def hold() -> str:
        started.set()
        release.wait(30)
        return "held"

    async def run(scope: RunScope, fn: Any) -> None:
        with scope.cancel_scope, scope.thread_scope():
            answers.append(await slots.run(scope, fn))

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run, first, hold)
            await _wait_in_thread(started)
            nursery.start_soon(run, second, lambda: "ran")
            await trio.testing.wait_all_tasks_blocked()
            mock_clock.jump(5)  # waiting for the one thread, five times its timeout
            await trio.testing.wait_all_tasks_blocked()
            release.set()
    finally:
        release.set()
    assert answers == ["held", "ran"] and second.reason is None


async def test_draining_and_drain_signalled_lines(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="jobs_trio")
    registry = Registry()
    started = trio.Event()

    @registry.job("long")
    async def long(ctx: JobContext, payload: None) -> None:
        started.set()
        await trio.sleep_forever()

    driver = trio_driver()
    w = worker(driver, registry)
    async with trio.open_nursery() as nursery:
        await nursery.start(w.run)
        await trio.testing.wait_all_tasks_blocked()
        await w.stop()  # a manual stop with nothing in flight is a teardown too
        await long.enqueue(driver)
        await nursery.start(w.run)
        await started.wait()
        w.accept("SIGTERM")
        w.accept("SIGTERM")  # a second lifecycle's accept: the same drain, told once
        await w.stop()

    def fields(event: str) -> list[Any]:
        return [r.fields for r in caplog.records if getattr(r, "event", None) == event]

    draining = fields("jobs.worker.draining")
    assert [(f["reason"], f["in_flight"]) for f in draining] == [("stop", 0), ("SIGTERM", 1)]
    assert [(f["reason"], f["runs"]) for f in fields("jobs.worker.drain-signalled")] == [
        ("SIGTERM", 1)
    ]


async def test_stats_carry_the_queue_depth(autojump_clock: object) -> None:
    registry = Registry()

    @registry.job("later", queue="mail")
    async def later(ctx: JobContext, payload: None) -> None:
        pass

    driver = trio_driver()
    await later.enqueue(driver, delay=3600)
    w = worker(driver, registry, stats_interval=5)
    assert w.stats().queue_depth == ()
    async with trio.open_nursery() as nursery:
        await nursery.start(w.run)
        await trio.sleep(1)
        [mail] = w.stats().queue_depth
        assert (mail.queue, mail.depth.get("ready")) == ("mail", 1)
        await w.stop()


async def test_a_shielded_last_step_after_the_drain_is_recorded_and_the_job_completes(
    autojump_clock: object,
) -> None:
    registry = Registry()
    started = trio.Event()
    charged: list[int] = []

    async def charge(amount: int) -> str:
        charged.append(amount)
        return "receipt-1"

    @registry.job("pay", attempts=1)
    async def pay(ctx: JobContext, payload: None) -> str:
        started.set()
        with trio.CancelScope(shield=True):
            await trio.sleep(1)  # the drain lands here
            receipt: str = await ctx.step.run("charge", charge, 42)
        return receipt

    driver = trio_driver()
    job_id = await pay.enqueue(driver)
    w = worker(driver, registry)
    async with trio.open_nursery() as nursery:
        await nursery.start(w.run)
        await started.wait()
        w.accept("SIGTERM")
        w.bind(trio.current_time() + 25)
        await w.stop()
    r = await record(driver, job_id)
    assert (r.state, r.result, charged) == (JobState.COMPLETED, "receipt-1", [42])
    [step] = await driver.load_steps(job_id)
    assert step.name == "charge" and step.result == '"receipt-1"'


class SlowSettles(MemoryDriver):
    """Every settle takes ``write`` seconds to commit: thirty hand-backs are ~15 ms of writing."""

    def __init__(self, write: float) -> None:
        super().__init__(clock=trio.current_time)
        self.write = write

    async def settle(self, settlements: Any) -> Any:
        await trio.sleep(self.write)
        return await super().settle(settlements)


@pytest.mark.parametrize("second_after", [0.0, 0.005])
async def test_a_second_signal_cuts_the_wait_for_bodies_never_the_hand_backs_they_decided(
    autojump_clock: object, caplog: pytest.LogCaptureFixture, second_after: float
) -> None:
    # Issue 32: SIGTERM, then 5 ms later SIGTERM again (a wrapper that signals twice): the
    # thirty bodies had all unwound, but the cut to zero dropped their hand-backs unwritten,
    # and every job lost an attempt to a signal. One deaf body is abandoned at the cut; the
    # thirty that stopped as asked are written under the floor.
    caplog.set_level(logging.INFO, logger="jobs_trio")
    registry = Registry()
    running = 0
    all_running = trio.Event()

    @registry.job("polite", timeout=None)
    async def polite(ctx: JobContext, payload: None) -> None:
        nonlocal running
        running += 1
        if running == 31:
            all_running.set()
        await trio.sleep_forever()

    @registry.job("deaf", timeout=None)
    async def deaf(ctx: JobContext, payload: None) -> None:
        nonlocal running
        running += 1
        if running == 31:
            all_running.set()
        with trio.CancelScope(shield=True):
            await trio.sleep(3600)

    driver = SlowSettles(write=0.01)
    polite_ids = await polite.enqueue_many(driver, [None] * 30)
    deaf_id = await deaf.enqueue(driver)
    reported: list[Sequence[str]] = []
    async with open_lifecycle(grace=25, signals=(), on_abandoned=reported.append) as lifecycle:
        w = worker(driver, registry, lifecycle=lifecycle, concurrency=40)
        async with trio.open_nursery() as nursery:
            await nursery.start(w.run)
            await all_running.wait()
            nursery.start_soon(lifecycle.shutdown, "SIGTERM")
            await trio.sleep(second_after)
            nursery.start_soon(lifecycle.shutdown, "SIGTERM")
            await lifecycle.closed.wait()
            nursery.cancel_scope.cancel()  # the deaf body: its process would end here (exit 70)
    assert reported == [[deaf_id]]
    for job_id in polite_ids:
        r = await record(driver, job_id)
        assert (r.state, r.attempts) == (JobState.READY, 0), job_id
    cut = [r for r in caplog.records if r.getMessage().startswith("jobs.lifecycle.budget-cut")]
    assert cut and cut[0].levelno == logging.WARNING
