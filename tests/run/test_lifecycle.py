# The lifecycle: accept before any wait, close under the grace budget, a second signal cuts the
# budget to zero, a signal landing on a manual stop joins it, and real signals reach it.
from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Sequence

import pytest
import trio
import trio.testing

from jobs_trio import Registry
from jobs_trio._core.records import JobState
from jobs_trio._run.budget import Budget
from jobs_trio._run.lifecycle import Lifecycle, open_lifecycle
from jobs_trio._run.worker import open_worker
from jobs_trio.drivers._open_driver import open_driver
from tests.helpers.worker_helpers import record, trio_driver, worker


class RecordingHook:
    """A part of an app that takes ``close_for`` seconds to close, within its budget."""

    def __init__(self, log: list[str], name: str, close_for: float = 0.0) -> None:
        self.log, self.name, self.close_for = log, name, close_for
        self.budget = Budget()

    def accept(self, reason: str) -> None:
        self.log.append(f"{self.name}.accept({reason})")

    def bind(self, deadline: float) -> None:
        self.budget.bind(deadline)

    async def aclose(self) -> Sequence[str]:
        self.log.append(f"{self.name}.close")
        with self.budget.scope:
            await trio.sleep(self.close_for)
        self.log.append(f"{self.name}.closed")
        return ()


async def test_accept_runs_on_every_hook_before_in_flight_work_is_waited_for(
    autojump_clock: object,
) -> None:
    log: list[str] = []
    async with open_lifecycle(grace=10, signals=()) as lifecycle:
        lifecycle.register(RecordingHook(log, "a"))
        lifecycle.register(RecordingHook(log, "b"))

        async def request() -> None:
            with lifecycle.track():
                await trio.sleep(3)
                log.append("request done")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(request)
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(lifecycle.shutdown, "SIGTERM")
    assert log[:3] == ["a.accept(SIGTERM)", "b.accept(SIGTERM)", "request done"]
    assert sorted(log[3:5]) == ["a.close", "b.close"]
    assert sorted(log[5:]) == ["a.closed", "b.closed"]


async def test_the_grace_period_bounds_close_and_a_second_signal_cuts_it_to_zero(
    autojump_clock: object,
) -> None:
    log: list[str] = []
    async with open_lifecycle(grace=25, signals=()) as lifecycle:
        slow = RecordingHook(log, "slow", close_for=1000)
        lifecycle.register(slow)
        t0 = trio.current_time()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lifecycle.shutdown, "SIGTERM")
            await trio.sleep(5)
            assert slow.budget.deadline == pytest.approx(t0 + 25)
            nursery.start_soon(lifecycle.shutdown, "SIGTERM")  # the second signal
    assert trio.current_time() == pytest.approx(t0 + 5)
    assert log[-1] == "slow.closed"


async def test_a_signal_on_a_manual_stop_joins_it_and_interrupts_the_runs(
    autojump_clock: object,
) -> None:
    registry = Registry()

    @registry.job("long", timeout=None)
    async def long(ctx: object, payload: None) -> None:
        await trio.sleep(3600)

    driver = trio_driver()
    job_id = await long.enqueue(driver)
    async with open_lifecycle(grace=25, signals=()) as lifecycle:
        w = worker(driver, registry, lifecycle=lifecycle)
        async with trio.open_nursery() as nursery:
            await nursery.start(w.run)
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(w.stop)  # manual: waits, cancels nothing
            await trio.sleep(100)
            assert w.state == "draining"
            t0 = trio.current_time()
            await lifecycle.shutdown("SIGTERM")
            assert trio.current_time() == t0  # the job stopped at once
    r = await record(driver, job_id)
    assert r.state is JobState.READY and r.attempts == 0


async def test_abandoned_work_is_reported_so_the_process_can_end(autojump_clock: object) -> None:
    registry = Registry()
    let_go = trio.Event()

    @registry.job("deaf", timeout=None)
    async def deaf(ctx: object, payload: None) -> None:
        with trio.CancelScope(shield=True):
            await let_go.wait()

    driver = trio_driver()
    job_id = await deaf.enqueue(driver)
    reported: list[Sequence[str]] = []
    async with open_lifecycle(grace=5, signals=(), on_abandoned=reported.append) as lifecycle:
        w = worker(driver, registry, lifecycle=lifecycle)
        async with trio.open_nursery() as nursery:
            await nursery.start(w.run)
            await trio.testing.wait_all_tasks_blocked()
            await lifecycle.shutdown("SIGTERM")
            assert reported == [[job_id]]
            assert w.state == "stopped"
            let_go.set()


async def test_a_real_sigterm_reaches_the_lifecycle() -> None:
    reasons: list[str] = []

    class Hook:
        def accept(self, reason: str) -> None:
            reasons.append(reason)

        def bind(self, deadline: float) -> None:
            pass

        async def aclose(self) -> Sequence[str]:
            return ()

    with trio.fail_after(10):
        async with open_lifecycle(grace=5) as lifecycle:
            lifecycle.register(Hook())
            os.kill(os.getpid(), signal.SIGTERM)
            await trio.sleep_forever()  # the shutdown ends this block
    assert reasons == ["SIGTERM"]


def test_a_negative_grace_is_refused() -> None:
    from jobs_trio import ConfigError

    with pytest.raises(ConfigError):
        Lifecycle(-1)


class _OwnSigterm:
    """Stands in for SIGTERM's default action (ending the test process) while a test sends it:
    a lifecycle's receiver replaces this handler while it listens, and puts it back after."""

    def __init__(self) -> None:
        self.received = 0

    def __enter__(self) -> _OwnSigterm:
        self._previous = signal.signal(signal.SIGTERM, self._count)
        return self

    def __exit__(self, *exc: object) -> None:
        signal.signal(signal.SIGTERM, self._previous)

    def _count(self, signum: int, frame: object) -> None:
        self.received += 1


async def test_open_worker_drains_on_sigterm_by_default(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="jobs_trio")
    registry = Registry()
    started = trio.Event()

    @registry.job("long", attempts=1)
    async def long(ctx: object, payload: None) -> None:
        started.set()
        await trio.sleep(3600)

    driver = trio_driver()
    job_id = await long.enqueue(driver)
    with _OwnSigterm() as unhandled, trio.fail_after(10):
        async with open_worker(driver, registry, stats_interval=None) as w:
            await started.wait()
            os.kill(os.getpid(), signal.SIGTERM)
            await trio.sleep_forever()  # the drain ends the block
    assert unhandled.received == 0
    assert "jobs.worker.lifecycle-opened" in caplog.text
    assert w.state == "stopped"
    r = await record(driver, job_id)
    assert (r.state, r.attempts) == (JobState.READY, 0)
    assert r.last_error is not None and "(SIGTERM)" in r.last_error


async def test_draining_can_be_opted_out_of(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="jobs_trio")
    registry = Registry()

    @registry.job("any")
    async def any_job(ctx: object, payload: None) -> None:
        pass

    async with open_worker(
        trio_driver(), registry, drain_on_shutdown=False, stats_interval=None
    ) as w:
        assert w._lifecycle is None
    assert "lifecycle-opened" not in caplog.text and "no-drain" not in caplog.text


def test_outside_the_main_thread_no_lifecycle_is_opened_and_it_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="jobs_trio")
    registry = Registry()

    @registry.job("any")
    async def any_job(ctx: object, payload: None) -> None:
        pass

    seen: list[object] = []

    async def main() -> None:
        async with open_worker(trio_driver(), registry, stats_interval=None) as w:
            seen.append(w._lifecycle)

    thread = threading.Thread(target=trio.run, args=(main,))
    thread.start()
    thread.join(10)
    assert seen == [None]
    assert "jobs.worker.no-drain" in caplog.text


async def test_a_stopped_worker_hands_its_registration_back(autojump_clock: object) -> None:
    registry = Registry()

    @registry.job("any")
    async def any_job(ctx: object, payload: None) -> None:
        pass

    lifecycle = Lifecycle(grace=5)
    w = worker(trio_driver(), registry, lifecycle=lifecycle)
    async with trio.open_nursery() as nursery:
        for _ in range(2):  # start -> stop -> start holds one registration
            await nursery.start(w.run)
            assert lifecycle._hooks == [w]
            await w.stop()
            assert lifecycle._hooks == []


async def test_a_shutdown_still_hears_what_a_worker_that_stopped_meanwhile_abandoned(
    autojump_clock: object,
) -> None:
    registry = Registry()
    let_go = trio.Event()

    @registry.job("deaf", timeout=None)
    async def deaf(ctx: object, payload: None) -> None:
        with trio.CancelScope(shield=True):
            await let_go.wait()

    driver = trio_driver()
    job_id = await deaf.enqueue(driver)
    reported: list[Sequence[str]] = []
    lifecycle = Lifecycle(grace=5, on_abandoned=reported.append)
    w = worker(driver, registry, lifecycle=lifecycle)
    async with trio.open_nursery() as nursery:
        await nursery.start(w.run)
        await trio.testing.wait_all_tasks_blocked()
        try:
            # The worker's teardown ends (and it unregisters) before the close phase asks it.
            await lifecycle.shutdown("SIGTERM")
        finally:
            let_go.set()
        assert reported == [[job_id]] and lifecycle._hooks == []


async def test_single_errors_from_open_blocks_come_out_as_themselves() -> None:
    registry = Registry()

    @registry.job("any")
    async def any_job(ctx: object, payload: None) -> None:
        pass

    class Mine(Exception):
        pass

    with pytest.raises(Mine):
        async with open_worker(trio_driver(), registry, stats_interval=None):
            raise Mine
    with pytest.raises(Mine):
        async with open_worker(
            trio_driver(), registry, drain_on_shutdown=False, stats_interval=None
        ):
            raise Mine
    with pytest.raises(Mine):
        async with open_lifecycle(grace=1, signals=()):
            raise Mine
    with pytest.raises(Mine):
        async with open_driver("memory://"):
            raise Mine


class _BudgetLeft:
    """A hook that notes the time left to each budget it is bound to."""

    def __init__(self) -> None:
        self.left: list[float] = []

    def accept(self, reason: str) -> None:
        pass

    def bind(self, deadline: float) -> None:
        self.left.append(deadline - trio.current_time())

    async def aclose(self) -> Sequence[str]:
        return ()


async def test_the_budget_counts_from_the_signals_arrival_not_from_when_the_loop_heard_it() -> None:
    """A signal that arrives while a job body blocks the loop (a time.sleep in an async body)
    is heard by the Trio task only once the block ends: the budget was the whole grace again
    from there, past the grace the operator gave (a supervisor's SIGKILL comes at the grace)."""
    bound = _BudgetLeft()

    with _OwnSigterm(), trio.fail_after(10):
        async with open_lifecycle(grace=5) as lifecycle:
            lifecycle.register(bound)
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(2)  # the loop blocked: the handler runs, the lifecycle's task cannot
            await trio.sleep_forever()  # the shutdown ends this block
    assert bound.left and bound.left[0] < 3.5, bound.left  # ~3 s of the 5 left, whatever the load
    end_by = lifecycle.end_by()
    assert end_by is not None and end_by <= time.monotonic() + 3.5


async def test_a_signal_held_at_start_up_counts_its_grace_from_its_arrival() -> None:
    """The console script holds SIGTERM while the application imports (~1 s): its grace was
    counted from when the lifecycle acted on it."""
    from jobs_trio._run.early_signals import EarlySignals

    early = EarlySignals()
    early.received.append("SIGTERM")
    early.arrived.append(time.monotonic() - 2.0)  # it came 2 s ago, during the imports
    bound = _BudgetLeft()

    with trio.fail_after(10):
        async with open_lifecycle(grace=5, signals=(), early=early) as lifecycle:
            lifecycle.register(bound)
            await trio.sleep_forever()  # the shutdown ends this block
    assert bound.left and bound.left[0] < 3.5, bound.left
