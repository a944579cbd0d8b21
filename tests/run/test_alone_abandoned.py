# A suspect's body abandoned at a drain's grace (docs/model.md, "A worker's death"): the worker
# unmarks its run alone before it exits, so the lapse orphans it instead of dead-lettering it.
from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import pytest
import trio
import trio.testing

from jobs_trio import JobContext, Registry
from jobs_trio._core.errors import DriverError
from jobs_trio._core.records import JobId, JobState, Lease
from jobs_trio._run.budget import WRITE_FLOOR
from jobs_trio._run.lifecycle import open_lifecycle
from jobs_trio.drivers._rules import KILLED_WORKER_ERROR, ORPHANED_ERROR, SUSPECT_AT
from jobs_trio.drivers.memory import MemoryDriver
from tests.helpers.worker_helpers import record, worker

LEASE = 10.0


class Unmarking(MemoryDriver):
    """Leases on the mock clock; ``fault``: its unmark_alone raises as an unreachable store
    ("fails") or never answers ("hangs")."""

    def __init__(self, *, fault: str | None = None) -> None:
        super().__init__(clock=trio.current_time)
        self.fault = fault
        self.unmarked: list[Sequence[Lease]] = []

    async def unmark_alone(self, leases: Sequence[Lease]) -> Sequence[JobId]:
        self.unmarked.append(leases)
        if self.fault == "hangs":
            await trio.sleep_forever()
        if self.fault == "fails":
            await trio.lowlevel.checkpoint()
            raise DriverError("the database is unreachable", fix="check it")
        return await super().unmark_alone(leases)


async def _drain_past_a_deaf_suspect(driver: MemoryDriver, grace: float) -> tuple[str, list[Any]]:
    """A suspect of "q" whose body ignores its cancellation runs alone on a worker that is then
    drained (SIGTERM, ``grace``): abandoned, the process would exit 70 here, no later than its
    writes' deadline. Answers its id and what the lifecycle reported abandoned; its lease has
    lapsed since."""
    registry = Registry()
    started = trio.Event()

    @registry.job("q.deaf", queue="q", timeout=None)
    async def deaf(ctx: JobContext, payload: None) -> None:
        started.set()
        with trio.CancelScope(shield=True):
            await trio.sleep(3600)

    job_id = await deaf.enqueue(driver)
    for dies in range(SUSPECT_AT):  # two workers died under it
        await driver.claim(["q"], 1, lease=LEASE, worker_id=f"dies-{dies}")
        await trio.sleep(LEASE + 1)
    assert await driver.claim(["q"], 1, lease=LEASE, worker_id="busy") == []
    reported: list[Any] = []
    async with open_lifecycle(grace=grace, signals=(), on_abandoned=reported.append) as lifecycle:
        w = worker(driver, registry, lifecycle=lifecycle, lease=LEASE)
        async with trio.open_nursery() as nursery:
            await nursery.start(w.run)
            await started.wait()
            assert (await record(driver, job_id)).worker_id == w.worker_id
            signalled = trio.current_time()
            nursery.start_soon(lifecycle.shutdown, "SIGTERM")
            await lifecycle.closed.wait()
            assert trio.current_time() - signalled <= max(grace, WRITE_FLOOR)
            # Not claimable while the abandoned body may still run (its process not yet gone).
            assert await driver.claim(["q"], 1, lease=LEASE, worker_id="early", alone=True) == []
            nursery.cancel_scope.cancel()  # the deaf body: its process ends here (exit 70)
    await trio.sleep(LEASE + 1)
    return job_id, reported


# 1 s: the bodies' wait ends before the writes' floor (2 s); 25 s: both would end together but
# for the reserve a worker holding a suspect keeps for this write.
@pytest.mark.parametrize("grace", [1.0, 25.0])
async def test_a_suspect_abandoned_at_the_grace_is_orphaned_not_dead_lettered(
    autojump_clock: Any, grace: float
) -> None:
    driver = Unmarking()
    job_id, reported = await _drain_past_a_deaf_suspect(driver, grace)
    assert reported == [[job_id]]
    assert len(driver.unmarked) == 1

    # The next claim finds its lease lapsed: orphaned, its attempt back, a suspect still.
    assert await driver.claim(["q"], 1, lease=LEASE, worker_id="next") == []
    r = await record(driver, job_id)
    assert (r.state, r.attempts, r.orphans) == (JobState.READY, 0, SUSPECT_AT + 1)
    assert r.last_error == ORPHANED_ERROR.format(orphans=SUSPECT_AT + 1)


@pytest.mark.parametrize("fault", ["fails", "hangs"])
async def test_an_unmark_that_fails_is_logged_and_the_exit_waits_no_longer(
    autojump_clock: Any, caplog: pytest.LogCaptureFixture, fault: str
) -> None:
    caplog.set_level(logging.INFO, logger="jobs_trio")
    driver = Unmarking(fault=fault)
    job_id, reported = await _drain_past_a_deaf_suspect(driver, 25.0)
    assert reported == [[job_id]] and len(driver.unmarked) == 1
    failed = [
        r for r in caplog.records if r.getMessage().startswith("jobs.worker.alone-unmark-failed")
    ]
    assert failed and failed[0].levelno == logging.WARNING and "retry" in failed[0].getMessage()

    # Left marked: its lapse dead-letters it, as before (the log said so and what to do).
    assert await driver.claim(["q"], 1, lease=LEASE, worker_id="next") == []
    r = await record(driver, job_id)
    assert r.state is JobState.DEAD and r.last_error == KILLED_WORKER_ERROR
