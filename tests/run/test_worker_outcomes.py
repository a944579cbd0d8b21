# One test per row of DESIGN's outcomes table: what the attempt ended as, whether it counted,
# where the job went, and what jobs_total says.
from __future__ import annotations

import json
import logging
import threading

import pytest
import trio
import trio.testing

from jobs_trio import OutcomeKind, Registry, TerminalError, WorkerState
from jobs_trio._core.backoff import Backoff
from jobs_trio._core.errors import AttemptCancelled
from jobs_trio._core.records import JobState
from jobs_trio._run.run_scope import CancelReason
from tests.helpers.worker_helpers import counted, record, trio_driver, worker


async def test_body_returning_completes_and_stores_the_result() -> None:
    registry = Registry()

    @registry.job("add")
    async def add(ctx: object, payload: dict[str, int]) -> int:
        return payload["a"] + payload["b"]

    driver = trio_driver()
    job_id = await add.enqueue(driver, {"a": 2, "b": 3})
    w = worker(driver, registry)
    [outcome] = await w.tick()
    assert outcome.kind == "completed"
    done = await record(driver, job_id)
    assert done.state is JobState.COMPLETED and done.result == 5 and done.attempts == 1
    assert counted(w._metrics, "ok", "add") == 1


async def test_raising_with_attempts_left_retries_after_backoff(autojump_clock: object) -> None:
    registry = Registry()

    @registry.job("flaky", attempts=3, backoff=Backoff(base=10, jitter=0))
    async def flaky(ctx: object, payload: None) -> None:
        raise ValueError("boom")

    driver = trio_driver()
    job_id = await flaky.enqueue(driver)
    w = worker(driver, registry)
    [outcome] = await w.tick()
    assert outcome.kind == "retried"
    r = await record(driver, job_id)
    assert r.state is JobState.READY and r.attempts == 1
    assert r.last_error == "ValueError: boom"
    assert r.run_at == pytest.approx(trio.current_time() + 10)
    assert await w.tick() == []  # not before the backoff
    await trio.sleep(10)
    [again] = await w.tick()
    assert again.kind == "retried" and (await record(driver, job_id)).attempts == 2
    assert counted(w._metrics, "failed", "flaky") == 2


async def test_raising_on_the_last_attempt_dead_letters(autojump_clock: object) -> None:
    registry = Registry()

    @registry.job("doomed", attempts=2, backoff=Backoff(base=1, jitter=0))
    async def doomed(ctx: object, payload: None) -> None:
        raise RuntimeError("still broken")

    driver = trio_driver()
    job_id = await doomed.enqueue(driver)
    w = worker(driver, registry)
    await w.tick()
    await trio.sleep(1)
    [outcome] = await w.tick()
    assert outcome.kind == "dead-lettered"
    r = await record(driver, job_id)
    assert r.state is JobState.DEAD and r.attempts == 2 and "still broken" in (r.last_error or "")
    assert counted(w._metrics, "dead", "doomed") == 1


async def test_a_terminal_error_dead_letters_at_once() -> None:
    registry = Registry()

    class NoSuchCustomer(Exception):
        pass

    @registry.job("bill", attempts=5, terminal=[NoSuchCustomer, "CARD_DECLINED"])
    async def bill(ctx: object, payload: str) -> None:
        if payload == "code":
            raise TerminalError("declined", code="CARD_DECLINED")
        raise NoSuchCustomer("gone")

    driver = trio_driver()
    by_type = await bill.enqueue(driver, "type")
    by_code = await bill.enqueue(driver, "code")
    w = worker(driver, registry)
    outcomes = await w.tick()
    assert sorted(o.kind for o in outcomes) == ["dead-lettered", "dead-lettered"]
    assert (await record(driver, by_type)).attempts == 1
    assert (await record(driver, by_code)).state is JobState.DEAD


async def test_the_runs_own_deadline_is_a_timeout_error(autojump_clock: object) -> None:
    registry = Registry()

    @registry.job("slow", timeout=5, attempts=2, backoff=Backoff(base=1, jitter=0))
    async def slow(ctx: object, payload: None) -> None:
        await trio.sleep(60)

    driver = trio_driver()
    job_id = await slow.enqueue(driver)
    w = worker(driver, registry)
    [outcome] = await w.tick()
    assert outcome.kind == "retried"
    r = await record(driver, job_id)
    assert r.last_error is not None and r.last_error.startswith("JobTimeout: [JOB_TIMEOUT]")
    await trio.sleep(1)
    [last] = await w.tick()
    assert last.kind == "dead-lettered"
    assert (await record(driver, job_id)).state is JobState.DEAD


async def test_a_timeout_below_the_clocks_grain_still_starts_the_body() -> None:
    # The deadline has passed by the time the run scope is entered: the body starts all the
    # same, and one that reaches no checkpoint returns and completes (a run cancelled before
    # its body started would be judged without a line of it run).
    registry = Registry()
    ran: list[int] = []

    @registry.job("tiny", timeout=1e-12, attempts=1)
    async def tiny(ctx: object, payload: None) -> int:
        ran.append(1)
        return 7

    driver = trio_driver()
    job_id = await tiny.enqueue(driver)
    [outcome] = await worker(driver, registry).tick()
    assert ran == [1] and outcome.kind == "completed"
    assert (await record(driver, job_id)).result == 7


async def test_a_drained_attempt_is_interrupted_uncounted_and_claimable_at_once(
    autojump_clock: object,
) -> None:
    registry = Registry()
    started = trio.Event()

    @registry.job("long", attempts=1)
    async def long(ctx: object, payload: None) -> None:
        started.set()
        await trio.sleep(3600)

    driver = trio_driver()
    job_id = await long.enqueue(driver)
    w = worker(driver, registry)
    async with trio.open_nursery() as nursery:
        await nursery.start(w.run)
        await started.wait()
        before = trio.current_time()
        w.accept("SIGTERM")
        w.bind(trio.current_time() + 25)
        await w.stop()
        assert trio.current_time() - before < 1  # no grace period spent on a job that stops
    r = await record(driver, job_id)
    assert r.state is JobState.READY and r.attempts == 0
    assert r.run_at <= trio.current_time()
    assert r.last_error is not None and "interrupted" in r.last_error
    assert w.stats().interrupted == 1
    assert counted(w._metrics, "failed", "long") == 0
    # The next worker claims it at once, with its one attempt intact.
    claims = await driver.claim(["default"], 1, lease=30, worker_id="next")
    assert [c.attempt for c in claims] == [1]


async def test_a_drained_body_that_raises_its_own_error_is_still_interrupted() -> None:
    registry = Registry()
    started = trio.Event()

    @registry.job("ssh")
    async def ssh(ctx: object, payload: None) -> None:
        started.set()
        try:
            await trio.sleep_forever()
        finally:
            raise ConnectionError("child killed")

    driver = trio_driver()
    job_id = await ssh.enqueue(driver)
    w = worker(driver, registry)
    async with trio.open_nursery() as nursery:
        await nursery.start(w.run)
        await started.wait()
        w.accept("SIGTERM")
        await w.stop()
    r = await record(driver, job_id)
    assert r.state is JobState.READY and r.attempts == 0
    assert "ConnectionError: child killed" in (r.last_error or "")


async def test_a_lost_lease_cancels_the_run_and_writes_nothing(autojump_clock: object) -> None:
    registry = Registry()
    cancelled = trio.Event()

    @registry.job("held")
    async def held(ctx: object, payload: None) -> None:
        try:
            await trio.sleep(3600)
        except trio.Cancelled:
            cancelled.set()
            raise

    driver = trio_driver()
    job_id = await held.enqueue(driver)
    w = worker(driver, registry, lease=30)
    async with trio.open_nursery() as nursery:
        await nursery.start(w.run)
        await trio.testing.wait_all_tasks_blocked()
        # Another worker takes the job over: our token is no longer current.
        driver._tokens[job_id] = "someone-else"
        await cancelled.wait()
        assert w.stats().outcomes["lost"] == 1
        r = await record(driver, job_id)
        assert r.state is JobState.RUNNING  # untouched by this worker
        await w.stop()


async def test_an_operator_cancel_reaches_the_running_job(autojump_clock: object) -> None:
    registry = Registry()
    started = trio.Event()

    @registry.job("report")
    async def report(ctx: object, payload: None) -> None:
        started.set()
        await trio.sleep(3600)

    driver = trio_driver()
    job_id = await report.enqueue(driver)
    w = worker(driver, registry, lease=30)
    async with trio.open_nursery() as nursery:
        await nursery.start(w.run)
        await started.wait()
        await driver.cancel(job_id)
        await trio.sleep(11)  # one renewal interval (lease / 3)
        await w.stop()
    r = await record(driver, job_id)
    assert r.state is JobState.CANCELLED and r.attempts == 1
    assert w.stats().outcomes["cancelled"] == 1


async def test_an_unknown_job_name_is_parked_not_failed() -> None:
    old = Registry()

    @old.job("legacy.thing")
    async def legacy(ctx: object, payload: None) -> None:
        pass

    new = Registry()

    @new.job("current.thing")
    async def current(ctx: object, payload: None) -> None:
        pass

    driver = trio_driver()
    job_id = await legacy.enqueue(driver)
    w = worker(driver, new, queues=["default"])
    [outcome] = await w.tick()
    assert outcome.kind == "parked"
    r = await record(driver, job_id)
    assert r.state is JobState.PARKED and r.attempts == 0
    assert "legacy.thing" in (r.last_error or "")


async def test_a_sync_body_runs_in_a_thread_and_stops_at_check_cancelled() -> None:
    registry = Registry()
    polled = threading.Event()
    stopped_by: list[BaseException] = []

    @registry.job("crunch")
    def crunch(ctx: object, payload: None) -> None:
        import jobs_trio

        assert isinstance(ctx, jobs_trio.JobContext)
        try:
            while True:
                ctx.check_cancelled()
                polled.set()
                threading.Event().wait(0.001)
        except BaseException as exc:
            stopped_by.append(exc)
            raise

    driver = trio_driver()
    job_id = await crunch.enqueue(driver)
    w = worker(driver, registry)
    async with trio.open_nursery() as nursery:
        await nursery.start(w.run)
        await trio.to_thread.run_sync(polled.wait)
        w.accept("SIGTERM")
        await w.stop()
    with trio.fail_after(5):
        while not stopped_by:
            await trio.to_thread.run_sync(polled.wait, 0.01)
    # The one type check_cancelled raises, carrying the typed reason; the worker waited for it.
    assert isinstance(stopped_by[0], AttemptCancelled) and stopped_by[0].code == "X_DRAINING"
    assert (await record(driver, job_id)).attempts == 0  # interrupted


async def test_a_sync_body_that_never_stops_is_abandoned_at_the_cancel(
    autojump_clock: object,
) -> None:
    registry = Registry()
    release = threading.Event()

    @registry.job("stubborn", timeout=5)
    def stubborn(ctx: object, payload: None) -> None:
        release.wait(60)

    driver = trio_driver()
    await stubborn.enqueue(driver)
    w = worker(driver, registry)
    try:
        [outcome] = await w.tick()
        assert outcome.kind == "retried"
    finally:
        release.set()


def test_outcomes_states_and_cancel_reasons_keep_the_words_they_had_as_strings() -> None:
    """They are enums now, and every reader outside the code sees the same words as before: the
    ``jobs.attempt.<kind>`` log lines, ``stats()`` and its JSON, Trio's cancel reasons."""
    assert [k.value for k in OutcomeKind] == [
        "completed",
        "suspended",
        "retried",
        "dead-lettered",
        "interrupted",
        "lost",
        "abandoned",
        "cancelled",
        "parked",
        "orphaned",
    ]
    assert [s.value for s in WorkerState] == ["idle", "running", "draining", "stopped"]
    assert [r.value for r in CancelReason] == [
        "timeout",
        "lease-lost",
        "lease-expired",
        "draining",
        "cancelled",
        "slot-lost",
        "held-too-long",
        "claim-late",
        "queue-paused",
    ]
    assert f"jobs.attempt.{OutcomeKind.DEAD_LETTERED}" == "jobs.attempt.dead-lettered"
    assert json.dumps({OutcomeKind.LOST: 1, "state": WorkerState.IDLE}) == (
        '{"lost": 1, "state": "idle"}'
    )


async def test_a_queue_no_declared_job_uses_is_named_at_start(
    autojump_clock: object, caplog: pytest.LogCaptureFixture
) -> None:
    # `--queue emials` (a typo) started a worker that ran nothing, silently: every job it could
    # claim there is of a name it does not declare.
    registry = Registry()

    @registry.job("send", queue="emails")
    async def send(ctx: object, payload: None) -> None:
        pass

    caplog.set_level(logging.WARNING, logger="jobs_trio")
    w = worker(trio_driver(), registry, queues=["emails", "emials"])
    async with trio.open_nursery() as nursery:
        await nursery.start(w.run)
        await w.stop()
    [warned] = [
        r for r in caplog.records if getattr(r, "event", "") == "jobs.worker.queue-undeclared"
    ]
    assert warned.fields["queue"] == "emials"  # type: ignore[attr-defined]
    assert warned.fields["declared"] == ["emails"]  # type: ignore[attr-defined]
