# Claiming ahead end to end, in real `jobs-trio worker --claim-ahead 8` processes on SQLite and
# PostgreSQL: SIGTERM hands every held job back at once, uncounted, and the process exits at
# once; SIGKILL costs no job an attempt (the running one is orphaned, the held ones handed back
# as they were: Claim.ahead, docs/model.md), and each runs once after its lease, never two at a
# time.
from __future__ import annotations

import functools
import signal
from pathlib import Path

import pytest
import trio

from jobs_trio._core.records import JobState
from jobs_trio.drivers._open_driver import open_driver
from tests.apps.drain_jobs_app import registry
from tests.helpers.process_helpers import record, until, worker_processes
from tests.run.test_drain_processes import body_started, database, marks

pytestmark = pytest.mark.slow

__all__ = ["database"]  # the fixture, shared with the drain's process tests

workers = functools.partial(worker_processes, "tests.apps.drain_jobs_app")
# One running, eight held: the hold limit well past the test, so only the signal ends their wait.
AHEAD = ("--concurrency", "1", "--claim-ahead", "8", "--hold-limit", "60")


async def test_sigterm_hands_every_held_job_back_at_once_uncounted(
    tmp_path: Path, database: str
) -> None:
    path = tmp_path / "marks.txt"
    async with open_driver(database) as driver:
        wait = registry.require("drain.wait")
        ids = [await wait.enqueue(driver, {"marks": str(path)}) for _ in range(9)]

        async def all_claimed() -> bool:
            return [(await record(driver, i)).state for i in ids] == [JobState.RUNNING] * 9

        async with workers(tmp_path, database, 1, "--queue", "wait", *AHEAD) as [worker]:
            await body_started(path)
            await until("the eight others to be claimed ahead", 20, all_claimed)
            sent = trio.current_time()
            worker.signal(signal.SIGTERM)
            code = await worker.exit_code(within=20)
            took = trio.current_time() - sent
        after = [await record(driver, i) for i in ids]
    assert code == 0, worker.output()
    # About a second alone: nothing waits out the grace (25 s), half of which is the bound.
    assert took < 12.5, f"exit took {took:.2f} s of a 25 s grace\n{worker.output()}"
    assert len(marks(path, "start")) == 1  # the held ones never started
    for r in after:
        # A deploy costs none of them an attempt; claimable at once by the next worker.
        assert (r.state, r.attempts) == (JobState.READY, 0), worker.output()
        assert r.last_error is not None and "X_DRAINING" in r.last_error
        assert r.run_at <= driver.now()


async def test_sigkill_costs_held_jobs_no_attempt_and_each_runs_once_after_its_lease(
    tmp_path: Path, database: str
) -> None:
    path = tmp_path / "marks.txt"
    lease = 3.0
    async with open_driver(database) as driver:
        # attempts=3; its first run sleeps `seconds`: the running one long enough to be
        # killed in it, the held ones not at all.
        crunch = registry.require("drain.crunch")
        ids = [
            await crunch.enqueue(driver, {"marks": str(path), "seconds": 60 if n == 0 else 0})
            for n in range(9)
        ]

        async def all_claimed() -> bool:
            return [(await record(driver, i)).state for i in ids] == [JobState.RUNNING] * 9

        async def all_completed() -> bool:
            return [(await record(driver, i)).state for i in ids] == [JobState.COMPLETED] * 9

        options = ("--queue", "crunch", "--lease", str(lease))
        async with workers(tmp_path, database, 1, *options, *AHEAD) as [first]:
            await body_started(path)
            await until("the eight others to be claimed ahead", 20, all_claimed)
            first.process.kill()
            await first.exit_code(within=10)
            killed_at = driver.now()
            async with workers(tmp_path, database, 1, *options, *AHEAD) as [second]:
                await until("the second worker to run all nine", 60, all_completed)
                second.signal(signal.SIGTERM)
                assert await second.exit_code(within=20) == 0, second.output()
        after = [await record(driver, i) for i in ids]
    starts = marks(path, "start")
    # The running one started twice (killed, then again); each held one once, on the second
    # worker, and only once its lease had lapsed: none ran on two workers at once.
    assert sorted(line[1] for line in starts) == sorted([*ids, starts[0][1]]), path.read_text()
    assert all(float(line[3]) >= killed_at - 0.5 for line in starts[1:]), (starts, killed_at)
    ran_first = starts[0][1]
    assert ran_first == ids[0], path.read_text()
    for r in after:
        # None is charged: the one that ran on the killed worker was orphaned; the held ones,
        # never started, were handed back as they were when their leases lapsed.
        orphans = 1 if r.id == ran_first else 0
        assert (r.state, r.attempts, r.orphans) == (JobState.COMPLETED, 1, orphans), r
