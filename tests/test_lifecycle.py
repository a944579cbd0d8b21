# The lifecycle: accept before any wait, close under the grace budget, a second signal cuts the
# budget to zero, a signal landing on a manual stop joins it, and real signals reach it.
from __future__ import annotations

import os
import signal
from collections.abc import Sequence

import pytest
import trio
import trio.testing

from jobs_trio import Registry
from jobs_trio.budget import Budget
from jobs_trio.lifecycle import Lifecycle, open_lifecycle
from jobs_trio.records import JobState

from .worker_helpers import record, trio_driver, worker


class RecordingHook:
    """A part of an app that takes ``close_for`` seconds to close, within its budget."""

    def __init__(self, log: list[str], name: str, close_for: float = 0.0) -> None:
        self.log, self.name, self.close_for = log, name, close_for
        self.budget = Budget()

    def accept(self, reason: str) -> None:
        self.log.append(f"{self.name}.accept({reason})")

    def bind(self, deadline: float) -> None:
        self.budget.bind(deadline)

    async def close(self) -> Sequence[str]:
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

        async def close(self) -> Sequence[str]:
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
