# Renewals and settlements of runs that overlap: a renewal answered after the run's settlement
# committed is not a lost lease (the job stopped running because it is done), and two runs of
# one job settled at once are told apart (the settler, not the renewal, says what landed).
from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest
import trio

from jobs_trio import Registry
from jobs_trio._core.records import Complete, JobState, Settlement
from jobs_trio._run.settler import Settler
from jobs_trio.drivers.memory import MemoryDriver
from jobs_trio.testing.conformance.helpers import new_job
from tests.helpers.worker_helpers import counted, record, worker


class SlowAnswerDriver(MemoryDriver):
    """Commits each settle at once, then answers it only after a renewal round has run: the
    window in which the run is still held (settling) while its job is already completed."""

    def __init__(self) -> None:
        super().__init__(clock=trio.current_time)
        self.renewed_after_commit = trio.Event()
        self.committed = False

    async def settle(self, settlements: Sequence[Settlement]) -> Sequence[str]:
        written = await super().settle(settlements)
        self.committed = True
        await self.renewed_after_commit.wait()
        return written

    async def renew(self, leases: Any, *, lease: float, started: Any = ()) -> Any:
        result = await super().renew(leases, lease=lease, started=started)
        if self.committed:
            self.renewed_after_commit.set()
        return result


async def test_a_renewal_answered_after_the_settlement_committed_is_not_a_lost_lease(
    autojump_clock: object, caplog: pytest.LogCaptureFixture
) -> None:
    registry = Registry()

    @registry.job("quick")
    async def quick(ctx: object, payload: object) -> str:
        return "done"

    driver = SlowAnswerDriver()
    job_id = await quick.enqueue(driver)
    w = worker(driver, registry, lease=3.0)
    with caplog.at_level(logging.WARNING, logger="jobs_trio"):
        async with trio.open_nursery() as nursery:
            await nursery.start(w.run)
            await driver.renewed_after_commit.wait()
            await w.stop()
    assert (await record(driver, job_id)).state is JobState.COMPLETED
    assert counted(w._metrics, "ok", "quick") == 1
    lost = [r.getMessage() for r in caplog.records if "jobs.lease.lost" in r.getMessage()]
    assert lost == []


async def test_two_runs_of_one_job_settled_together_are_told_apart(
    autojump_clock: object,
) -> None:
    """A lapsed claim and its re-claim, both finished at once: only the current one's write
    applies, and the settler must not report the fenced one as written too (drivers answer
    by job id, so the two never share a batch)."""
    driver = MemoryDriver(clock=trio.current_time)
    [answer] = await driver.enqueue([new_job("t.twice")])
    [old] = await driver.claim(["default"], 1, lease=5.0, worker_id="w1")
    await trio.sleep(6)  # the lease lapses: the next claim takes the job again
    [new] = await driver.claim(["default"], 1, lease=5.0, worker_id="w1")
    assert (old.job_id, new.job_id) == (answer.job_id, answer.job_id)
    settler = Settler(driver)
    async with trio.open_nursery() as nursery:
        await nursery.start(settler.run)
        stale = settler.hand_in(Complete(old.lease, '"old"'))
        current = settler.hand_in(Complete(new.lease, '"new"'))
        assert (await settler.confirmed(stale), await settler.confirmed(current)) == (False, True)
        settler.stop_intake()
    assert (await record(driver, answer.job_id)).result == "new"


async def test_an_idle_worker_renews_nothing_and_does_not_wake_to_try(
    autojump_clock: object,
) -> None:
    """With no run held, the renewal loop sleeps until one is: an idle worker's only wake-ups
    are its claim loop's (hourly here), not one every renew interval."""
    registry = Registry()

    @registry.job("quick")
    async def quick(ctx: object, payload: object) -> str:
        return "done"

    steps: Counter[str] = Counter()

    class CountSteps(trio.abc.Instrument):
        def before_task_step(self, task: trio.lowlevel.Task) -> None:
            steps[task.name.rsplit(".", 1)[-1]] += 1

    driver = MemoryDriver(clock=trio.current_time)
    w = worker(driver, registry, lease=3.0, safety_poll=3600.0, retention=None)
    trio.lowlevel.add_instrument(CountSteps())
    async with trio.open_nursery() as nursery:
        await nursery.start(w.run)
        await trio.sleep(24 * 3600)
        idle = steps["renew_leases"]
        job_id = await quick.enqueue(driver)  # a run held: the loop wakes and renews again
        await trio.sleep(10)
        await w.stop()
    assert idle <= 2, f"an idle day woke the renewal loop {idle} times (every 1 s before)"
    assert steps["renew_leases"] > idle
    assert (await record(driver, job_id)).state is JobState.COMPLETED
