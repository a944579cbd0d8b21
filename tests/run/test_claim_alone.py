# The worker's side of the orphan rule (docs/model.md, "A worker's death"): a suspect is claimed
# only by a worker that runs nothing, and nothing is claimed beside it while it runs.
from __future__ import annotations

from typing import Any

import trio
import trio.testing

from jobs_trio import Registry
from jobs_trio._core.records import Claim, JobState
from jobs_trio.drivers._rules import SUSPECT_AT
from jobs_trio.drivers.memory import MemoryDriver
from tests.helpers.worker_helpers import record, worker
from tests.run.test_claim_loop import blocking_registry


class Recording(MemoryDriver):
    """Every claim's ``alone`` and what it brought."""

    def __init__(self) -> None:
        super().__init__(clock=trio.current_time)  # leases lapse on the mock clock
        self.asked_alone: list[bool] = []
        self.brought: list[list[str]] = []
        self.deaf = False

    async def wait_for_work(
        self, queues: Any, timeout: float, *, alone: bool = False, **kw: Any
    ) -> None:
        if self.deaf and not alone:
            # Deaf to everything but its timeout: only a wait alone can see the suspect (as on
            # PostgreSQL, where a settle notifies no waiter and a suspect is no enqueue).
            await trio.sleep(timeout)
            return
        await super().wait_for_work(queues, timeout, alone=alone, **kw)

    async def claim(self, *args: Any, alone: bool = False, **kw: Any) -> Any:
        claims: list[Claim] = list(await super().claim(*args, alone=alone, **kw))
        self.asked_alone.append(alone)
        self.brought.append([c.job_id for c in claims])
        return claims


async def _suspect(driver: MemoryDriver, registry: Registry, payload: str) -> str:
    """A job of "q" orphaned twice (two workers died under it): claimed only alone."""
    job_id = await registry.require("q.job").enqueue(driver, payload)
    for dies in range(SUSPECT_AT):
        # The claim that finds it lapsed hands it back, then takes it again (but the last).
        await driver.claim(["q"], 1, lease=10, worker_id=f"dies-{dies}")
        await trio.sleep(11)
    assert await driver.claim(["q"], 1, lease=10, worker_id="busy") == []  # handed back only
    assert (await record(driver, job_id)).orphans == SUSPECT_AT
    return job_id


async def test_an_idle_worker_runs_a_suspect_alone_and_claims_nothing_beside_it(
    autojump_clock: Any,
) -> None:
    registry, release, running = blocking_registry(["q"])
    driver = Recording()
    suspect = await _suspect(driver, registry, "s")
    await registry.require("q.job").enqueue_many(driver, ["a", "b"])
    driver.asked_alone.clear()
    w = worker(driver, registry, concurrency=3, safety_poll=30.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(w.run)
        await trio.sleep(20)  # past two renewals and a safety poll: nothing joins it
        # Two free slots and two due jobs, and still only the suspect runs.
        assert running == {"s"}
        assert driver.asked_alone == [True]  # one claim, alone, and none while it runs
        release["s"].set()
        await trio.sleep(1)
        assert running == {"a", "b"}  # its end lets the worker claim again
        assert (await record(driver, suspect)).state is JobState.COMPLETED
        release["a"].set()
        release["b"].set()
        await w.stop()


async def test_a_busy_worker_leaves_a_suspect_and_takes_it_once_it_runs_nothing(
    autojump_clock: Any,
) -> None:
    registry, release, running = blocking_registry(["q"])
    driver = Recording()
    # A wait not alone hears nothing but its timeout (1000 s): as on PostgreSQL, where neither
    # a settle nor a hand-back notifies a waiter. Only the worker's own look alone, once it
    # runs nothing, can find the suspect in time.
    driver.deaf = True
    # Orphaned once, and running on a second worker (lease 10 s) that is about to die too.
    suspect = await registry.require("q.job").enqueue(driver, "s")
    await driver.claim(["q"], 1, lease=10, worker_id="dies-0")
    await trio.sleep(11)
    await driver.claim(["q"], 1, lease=10, worker_id="dies-1")
    await registry.require("q.job").enqueue(driver, "long")
    w = worker(driver, registry, concurrency=3, safety_poll=1000.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(w.run)
        await trio.sleep(1)
        assert running == {"long"}  # its first claim, alone (it ran nothing), took it
        await trio.sleep(10)
        # Another worker's claim finds the lease lapsed: orphaned twice, a suspect.
        assert await driver.claim(["q"], 5, lease=10, worker_id="rescuer") == []
        assert (await record(driver, suspect)).orphans == SUSPECT_AT
        await trio.sleep(5)
        assert running == {"long"}  # two free slots here, never used for the suspect
        release["long"].set()
        # Running nothing now, it looks again alone and takes the suspect.
        await trio.sleep(1)
        assert running == {"s"} and driver.asked_alone[-1]
        release["s"].set()
        await trio.sleep(1)
        assert (await record(driver, suspect)).state is JobState.COMPLETED
        await w.stop()
