# Durable steps on the worker: recorded once and replayed, sleeps and event waits that suspend
# the job without costing an attempt, ceilings, and fencing once a run was cancelled.
from __future__ import annotations

import logging
import threading
from collections import Counter

import pytest
import trio
import trio.testing

import jobs_trio
from jobs_trio import EventTimedOut, Registry, send_event
from jobs_trio._core.records import JobState, StepStatus
from tests.helpers.worker_helpers import record, trio_driver, worker


async def test_a_recorded_step_is_not_run_again_after_a_sleep(autojump_clock: object) -> None:
    registry = Registry()
    calls: Counter[str] = Counter()

    def charge(amount: int) -> dict[str, int]:  # sync: runs in a thread
        calls["charge"] += 1
        return {"charged": amount}

    async def email() -> str:
        calls["email"] += 1
        return "sent"

    @registry.job("order", timeout=None)
    async def order(ctx: jobs_trio.JobContext, payload: dict[str, int]) -> list[object]:
        receipt = await ctx.step.run("charge", charge, payload["amount"])
        await ctx.step.sleep("cool-off", 3600)
        sent = await ctx.step.run("email", email)
        return [receipt, sent]

    driver = trio_driver()
    job_id = await order.enqueue(driver, {"amount": 42})
    w = worker(driver, registry)
    [first] = await w.tick()
    assert first.kind == "suspended"
    r = await record(driver, job_id)
    assert r.state is JobState.SUSPENDED and r.attempts == 0
    assert await w.tick() == []  # not before its time
    await trio.sleep(3600)
    [second] = await w.tick()
    assert second.kind == "completed"
    done = await record(driver, job_id)
    assert done.result == [{"charged": 42}, "sent"] and done.attempts == 1
    assert calls == {"charge": 1, "email": 1}
    steps = {s.name: s for s in await driver.load_steps(job_id)}
    assert steps["charge"].result == '{"charged":42}'
    assert steps["cool-off"].status is StepStatus.DONE
    assert steps["cool-off"].finished_at == pytest.approx(3600)


@pytest.mark.parametrize("wait", ["sleep", "wait_for_event"])
async def test_a_step_that_suspends_inside_the_bodys_own_nursery_suspends_the_job(
    autojump_clock: object, wait: str
) -> None:
    # A helper task beside the steps (a heartbeat, say): Trio hands the suspension up wrapped
    # in an exception group, which cost the job an attempt at every sleep until it was dead.
    registry = Registry()
    calls: Counter[str] = Counter()

    def fetch() -> str:
        calls["fetch"] += 1
        return "a"

    @registry.job("wf", attempts=2, timeout=None)
    async def wf(ctx: jobs_trio.JobContext, payload: None) -> object:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.sleep_forever)
            fetched = await ctx.step.run("fetch", fetch)
            if wait == "sleep":
                woke = await ctx.step.sleep("nap", 60)
            else:
                woke = await ctx.step.wait_for_event("go", "go", timeout=120)
            nursery.cancel_scope.cancel()
        return [fetched, woke]

    driver = trio_driver()
    job_id = await wf.enqueue(driver)
    w = worker(driver, registry)
    assert [o.kind for o in await w.tick()] == ["suspended"]
    r = await record(driver, job_id)
    assert (r.state, r.attempts) == (JobState.SUSPENDED, 0)
    if wait == "sleep":
        await trio.sleep(60)
    else:
        await send_event(driver, "go", {"ok": 1})
    assert [o.kind for o in await w.tick()] == ["completed"]
    done = await record(driver, job_id)
    assert done.attempts == 1 and calls == {"fetch": 1}


async def test_an_error_beside_a_suspension_in_a_nursery_is_the_jobs_failure() -> None:
    registry = Registry()

    async def fails() -> None:
        raise ValueError("the helper task failed")

    @registry.job("wf", attempts=1, timeout=None)
    async def wf(ctx: jobs_trio.JobContext, payload: None) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(fails)
            nursery.start_soon(ctx.step.sleep, "nap", 60)

    driver = trio_driver()
    job_id = await wf.enqueue(driver)
    [outcome] = await worker(driver, registry).tick()
    assert outcome.kind == "dead-lettered"
    # The stored error names what failed inside the group, not only the group.
    error = (await record(driver, job_id)).last_error or ""
    assert error.startswith("ExceptionGroup: ") and "[ValueError: the helper task failed]" in error


@pytest.mark.parametrize("beside_a_helper_task", [False, True])
async def test_a_step_name_used_twice_is_a_clear_terminal_error(beside_a_helper_task: bool) -> None:
    # Beside a helper task the StepError reaches the verdict inside an exception group, which
    # must still read as terminal (it was retried to the last attempt).
    registry = Registry()

    async def steps(ctx: jobs_trio.JobContext) -> None:
        for _ in range(2):
            await ctx.step.run("send", lambda: 1)

    @registry.job("dup", attempts=5)
    async def dup(ctx: jobs_trio.JobContext, payload: None) -> None:
        if not beside_a_helper_task:
            await steps(ctx)
            return
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.sleep_forever)
            await steps(ctx)

    driver = trio_driver()
    job_id = await dup.enqueue(driver)
    [outcome] = await worker(driver, registry).tick()
    assert outcome.kind == "dead-lettered"
    r = await record(driver, job_id)
    assert r.attempts == 1 and "X_STEP" in (r.last_error or "")
    assert "'send' is used twice" in (r.last_error or "")


@pytest.mark.parametrize(
    ("before", "after", "recorded"),
    [
        ("wait_for_event", "sleep", "step.wait_for_event"),
        ("run", "wait_for_event", "a finished step.run or step.sleep"),
        ("sleep", "run", "step.sleep"),
        ("sleep", "wait_for_event", "step.sleep"),
    ],
)
async def test_a_step_name_reused_for_another_kind_by_a_deploy_is_a_clear_terminal_error(
    autojump_clock: object, before: str, after: str, recorded: str
) -> None:
    # Misread as the new kind's record, the old one failed with an AssertionError or an
    # AttributeError, retried to the last attempt.
    async def call(ctx: jobs_trio.JobContext, kind: str) -> None:
        if kind == "run":
            await ctx.step.run("approval", lambda: ["id-1"])
        elif kind == "sleep":
            await ctx.step.sleep("approval", 60)
        else:
            await ctx.step.wait_for_event("approval", "approved")
        await ctx.step.sleep("then", 60)  # every old deploy's run stops here at the latest

    old, new = Registry(), Registry()
    for registry, kind in ((old, before), (new, after)):

        async def wf(ctx: jobs_trio.JobContext, payload: None, kind: str = kind) -> None:
            await call(ctx, kind)

        registry.job("wf", attempts=3, timeout=None)(wf)
    driver = trio_driver()
    job_id = await old.require("wf").enqueue(driver)
    assert [o.kind for o in await worker(driver, old).tick()] == ["suspended"]
    await trio.sleep(60)
    [outcome] = await worker(driver, new).tick()
    assert outcome.kind == "dead-lettered"
    r = await record(driver, job_id)
    assert r.attempts == 1 and "X_STEP" in (r.last_error or "")
    assert f"'approval' of job 'wf' is recorded as {recorded}" in (r.last_error or "")
    assert f"now called as step.{after}" in (r.last_error or "")


async def test_an_unserialisable_step_result_names_the_step() -> None:
    registry = Registry()

    @registry.job("bad", attempts=5)
    async def bad(ctx: jobs_trio.JobContext, payload: None) -> None:
        await ctx.step.run("fetch", lambda: {"when": object()})

    driver = trio_driver()
    job_id = await bad.enqueue(driver)
    [outcome] = await worker(driver, registry).tick()
    assert outcome.kind == "dead-lettered"
    error = (await record(driver, job_id)).last_error or ""
    assert "step 'fetch'" in error and "object is not JSON-serialisable" in error
    assert await driver.load_steps(job_id) == []


async def test_wait_for_event_resumes_on_a_matching_event(autojump_clock: object) -> None:
    registry = Registry()

    @registry.job("ship", timeout=None)
    async def ship(ctx: jobs_trio.JobContext, payload: str) -> object:
        return await ctx.step.wait_for_event("shipped", "order.shipped", match=payload)

    driver = trio_driver()
    job_id = await ship.enqueue(driver, "order-7")
    w = worker(driver, registry)
    assert [o.kind for o in await w.tick()] == ["suspended"]
    await send_event(driver, "order.shipped", {"carrier": "x"}, key="order-8")  # not ours
    # Not woken at all: a send of another key leaves it asleep (it woke, looked and slept again
    # for every send of the name, every waiter of the name alike).
    assert (await record(driver, job_id)).state is JobState.SUSPENDED
    assert await w.tick() == []
    await send_event(driver, "order.shipped", {"carrier": "dhl"}, key="order-7")
    assert (await record(driver, job_id)).state is JobState.READY
    [done] = await w.tick()
    assert done.kind == "completed"
    assert (await record(driver, job_id)).result == {"carrier": "dhl"}


async def test_wait_for_event_times_out_into_an_error_the_job_can_catch(
    autojump_clock: object,
) -> None:
    registry = Registry()

    @registry.job("ship", timeout=None, event_poll=30)
    async def ship(ctx: jobs_trio.JobContext, payload: None) -> str:
        try:
            await ctx.step.wait_for_event("shipped", "order.shipped", timeout=100)
        except EventTimedOut:
            return "gave up"
        return "shipped"

    driver = trio_driver()
    job_id = await ship.enqueue(driver)
    w = worker(driver, registry)
    await w.tick()
    # event_poll is the ceiling on how long a waiting job sleeps between looks.
    assert (await record(driver, job_id)).run_at == pytest.approx(trio.current_time() + 30)
    for _ in range(3):
        await trio.sleep(30)
        assert [o.kind for o in await w.tick()] == ["suspended"]
    await trio.sleep(10)
    [done] = await w.tick()
    assert done.kind == "completed" and (await record(driver, job_id)).result == "gave up"


async def test_events_sent_before_the_wait_count_only_when_asked(autojump_clock: object) -> None:
    registry = Registry()

    @registry.job("early", timeout=None)
    async def early(ctx: jobs_trio.JobContext, payload: bool) -> object:
        return await ctx.step.wait_for_event("w", "ready", include_earlier=payload)

    driver = trio_driver()
    await send_event(driver, "ready", 1)
    await trio.sleep(1)
    eager = await early.enqueue(driver, True)
    strict = await early.enqueue(driver, False)
    outcomes = {o.job_id: o.kind for o in await worker(driver, registry).tick()}
    assert outcomes == {eager: "completed", strict: "suspended"}


async def test_step_timeout_bounds_one_step(autojump_clock: object) -> None:
    registry = Registry()

    @registry.job("slowstep", step_timeout=5, timeout=None, attempts=1)
    async def slowstep(ctx: jobs_trio.JobContext, payload: None) -> None:
        async def crawl() -> None:
            await trio.sleep(60)

        await ctx.step.run("crawl", crawl)

    driver = trio_driver()
    job_id = await slowstep.enqueue(driver)
    [outcome] = await worker(driver, registry).tick()
    assert outcome.kind == "dead-lettered"
    # Named: a bare fail_after stored "TooSlowError: " alone, neither the step nor the limit.
    dead = await record(driver, job_id)
    assert "TooSlowError: step 'crawl' ran past its step_timeout of 5 s" in (dead.last_error or "")
    assert dead.attempts == 1
    assert await driver.load_steps(job_id) == []
    assert trio.current_time() == pytest.approx(5)


async def test_a_step_finished_after_the_drain_is_not_recorded(autojump_clock: object) -> None:
    registry = Registry()
    in_step = trio.Event()

    @registry.job("stubborn", timeout=None)
    async def stubborn(ctx: jobs_trio.JobContext, payload: None) -> None:
        async def charge() -> str:
            with trio.CancelScope(shield=True):  # finishes whatever it is told
                in_step.set()
                await trio.sleep(5)
            return "charged"

        await ctx.step.run("charge", charge)

    driver = trio_driver()
    job_id = await stubborn.enqueue(driver)
    w = worker(driver, registry)
    async with trio.open_nursery() as nursery:
        await nursery.start(w.run)
        await in_step.wait()
        w.accept("SIGTERM")
        await w.stop()
    # Only the step's function was shielded: its record's write, after it, is cut short by the
    # drain (a step wholly inside a shield is recorded: tests/run/test_drain.py).
    assert await driver.load_steps(job_id) == []
    r = await record(driver, job_id)
    assert r.state is JobState.READY and r.attempts == 0
    assert "X_DRAINING" in (r.last_error or "")


async def test_a_drain_waits_for_a_sync_steps_thread_and_records_what_it_returns() -> None:
    # Abandoned at the drain, the step's thread ran on while its job went back to the queue,
    # and the next worker ran the same step beside it: two runs at once.
    registry = Registry()
    in_step, release = threading.Event(), threading.Event()
    calls: Counter[str] = Counter()

    def charge() -> str:  # sync: runs in a thread, never looks at its cancellation
        calls["charge"] += 1
        in_step.set()
        release.wait(30)
        return "charged"

    async def notify() -> str:
        calls["notify"] += 1
        await trio.lowlevel.checkpoint()  # where the drain's cancel reaches the body
        return "sent"

    @registry.job("pay", timeout=None)
    async def pay(ctx: jobs_trio.JobContext, payload: None) -> list[str]:
        return [await ctx.step.run("charge", charge), await ctx.step.run("notify", notify)]

    driver = trio_driver()
    job_id = await pay.enqueue(driver)
    w = worker(driver, registry)
    async with trio.open_nursery() as nursery:
        await nursery.start(w.run)
        await trio.to_thread.run_sync(in_step.wait, 10)
        w.accept("SIGTERM")
        w.bind(trio.current_time() + 60)
        await trio.testing.wait_all_tasks_blocked()
        # The drain waits for the thread: the job is still this worker's, not back in the queue.
        assert (await record(driver, job_id)).state is JobState.RUNNING
        release.set()
    r = await record(driver, job_id)
    assert (r.state, r.attempts) == (JobState.READY, 0) and "X_DRAINING" in (r.last_error or "")
    [charged] = await driver.load_steps(job_id)  # what the thread returned, recorded
    assert (charged.name, charged.result) == ("charge", '"charged"')
    [done] = await worker(driver, registry).tick()
    assert done.kind == "completed" and (await record(driver, job_id)).attempts == 1
    assert calls == {"charge": 1, "notify": 2}  # charge replayed, not run again


async def test_a_sync_step_past_its_step_timeout_is_abandoned_as_too_slow() -> None:
    registry = Registry()
    release = threading.Event()

    @registry.job("slow", step_timeout=0.05, timeout=None, attempts=1)
    async def slow(ctx: jobs_trio.JobContext, payload: None) -> None:
        await ctx.step.run("crawl", release.wait, 30)

    driver = trio_driver()
    job_id = await slow.enqueue(driver)
    try:
        [outcome] = await worker(driver, registry).tick()
    finally:
        release.set()
    assert outcome.kind == "dead-lettered"
    error = (await record(driver, job_id)).last_error or ""
    assert "TooSlowError" in error and "step 'crawl'" in error
    assert await driver.load_steps(job_id) == []


async def test_abandoned_sync_steps_never_hold_the_thread_another_queues_sync_body_waits_for() -> (
    None
):
    # On the worker's body-thread limiter (one thread per slot), two sync steps side by side,
    # abandoned at their step_timeout and still running, took both threads: queue b's sync
    # body sat claimed in its free slot, never started, past its own timeout.
    registry = Registry()
    release, b_ran = threading.Event(), threading.Event()

    @registry.job("a.two", queue="a", step_timeout=0.05, timeout=None, attempts=1)
    async def two(ctx: jobs_trio.JobContext, payload: None) -> None:
        async with trio.open_nursery() as nursery:
            for name in ("s1", "s2"):
                nursery.start_soon(ctx.step.run, name, release.wait, 30)

    @registry.job("b.sync", queue="b", timeout=10)
    def b_sync(ctx: jobs_trio.JobContext, payload: None) -> None:
        b_ran.set()

    driver = trio_driver()
    a_id = await two.enqueue(driver)
    w = worker(driver, registry, concurrency={"a": 1, "b": 1})
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(w.run)
            with trio.fail_after(10):
                while (await record(driver, a_id)).state is not JobState.DEAD:
                    await trio.sleep(0.01)
            await b_sync.enqueue(driver)
            # Both of a's step threads still run (release is not set): b's body starts anyway.
            assert await trio.to_thread.run_sync(b_ran.wait, 10)
            nursery.cancel_scope.cancel()
    finally:
        release.set()


async def test_a_sync_body_that_finishes_after_it_was_abandoned_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    registry = Registry()
    release, finished = threading.Event(), threading.Event()

    @registry.job("late", timeout=0.05)
    def late(ctx: jobs_trio.JobContext, payload: None) -> str:
        release.wait(10)
        finished.set()
        return "too late"

    driver = trio_driver()
    job_id = await late.enqueue(driver)
    with caplog.at_level(logging.WARNING, logger="jobs_trio"):
        [outcome] = await worker(driver, registry).tick()
        assert outcome.kind == "retried"
        release.set()
        await trio.to_thread.run_sync(finished.wait, 10)
        with trio.fail_after(10):
            while not any(r.event == "jobs.timeout.abandoned" for r in caplog.records):  # type: ignore[attr-defined]
                await trio.sleep(0.01)
    r = await record(driver, job_id)
    assert r.state is JobState.READY and r.result is None and "JOB_TIMEOUT" in (r.last_error or "")


async def test_a_drain_mid_step_replays_the_recorded_steps_on_the_next_worker(
    autojump_clock: object,
) -> None:
    registry = Registry()
    ran: Counter[str] = Counter()

    @registry.job("three", timeout=None)
    async def three(ctx: jobs_trio.JobContext, payload: None) -> int:
        total = 0
        for n in (1, 2, 3):

            async def work(n: int = n) -> int:
                ran[f"step{n}"] += 1
                await trio.sleep(10)
                return n

            total += await ctx.step.run(f"step{n}", work)
        return total

    driver = trio_driver()
    job_id = await three.enqueue(driver)
    first = worker(driver, registry)
    async with trio.open_nursery() as nursery:
        await nursery.start(first.run)
        await trio.sleep(25)  # steps 1 and 2 done, step 3 under way
        first.accept("SIGTERM")
        await first.stop()
    assert (await record(driver, job_id)).attempts == 0
    second = worker(driver, registry)
    [outcome] = await second.tick()
    assert outcome.kind == "completed"
    assert (await record(driver, job_id)).result == 6
    assert ran == {"step1": 1, "step2": 1, "step3": 2}


async def test_send_event_checks_its_input_at_the_boundary() -> None:
    driver = trio_driver()
    with pytest.raises(jobs_trio.ConfigError):
        await send_event(driver, "", {})
    with pytest.raises(jobs_trio.PayloadNotSerialisable) as caught:
        await send_event(driver, "shipped", {"at": object()})
    assert caught.value.field == "payload.at"
    assert (await driver.look_for_event("shipped", key=None, since=None)).found is None
