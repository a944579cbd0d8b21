# Claims answered late (a stalled database, a paused process): a worker counts each lease from
# when it SENT the claim, so a job whose lease ran out before the answer came never runs there.
from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
import trio

from jobs_trio import JobContext, OutcomeKind, Registry
from jobs_trio._core.errors import DriverError
from jobs_trio._core.records import Claim, JobState, Lease, RenewResult
from jobs_trio.drivers.memory import MemoryDriver
from jobs_trio.testing.conformance.helpers import new_job
from tests.helpers.worker_helpers import record, worker

LEASE = 8.0  # margin 2 s: a run is stopped 6 s after its lease was last set


class StalledClaims(MemoryDriver):
    """Each claim of a worker named in ``stall`` commits at once, then its answer takes that
    many seconds to come back (the first claim that returns a job only); renewals fail from
    ``renewals_fail_at`` on."""

    def __init__(self, stall: Mapping[str, float], renewals_fail_at: float = float("inf")):
        super().__init__(clock=trio.current_time)
        self.stall = dict(stall)
        self.renewals_fail_at = renewals_fail_at

    async def claim(
        self,
        queues: Sequence[str],
        limit: int | Mapping[str, int],
        *,
        lease: float,
        worker_id: str,
        free: Mapping[str, int] | None = None,
        rescue: bool = True,
        alone: bool = False,
    ) -> Sequence[Claim]:
        claims = await super().claim(
            queues, limit, lease=lease, worker_id=worker_id, free=free, rescue=rescue, alone=alone
        )
        if claims and worker_id in self.stall:
            await trio.sleep(self.stall.pop(worker_id))
        return claims

    async def renew(
        self, leases: Sequence[Lease], *, lease: float, started: Sequence[str] = ()
    ) -> RenewResult:
        if trio.current_time() >= self.renewals_fail_at:
            raise DriverError("renewals refused (test)")
        return await super().renew(leases, lease=lease, started=started)


@pytest.mark.parametrize("claim_ahead", [0, 4])
async def test_a_claim_answered_after_its_lease_ran_out_never_starts_its_body(
    autojump_clock: object, caplog: pytest.LogCaptureFixture, claim_ahead: int
) -> None:
    """Worker A's claim commits at 0 and is answered at 9, after the 8 s lease; worker B
    claims the lapsed job at 8 and runs it until 20. Run from the answer, A would start the
    body at 9 beside B's: two copies of one job at once."""
    registry = Registry()
    running: list[str] = []
    most_at_once = 0
    attempts: list[int] = []

    @registry.job("long")
    async def long(ctx: JobContext, payload: Any) -> None:
        nonlocal most_at_once
        running.append(ctx.worker_id)
        attempts.append(ctx.attempt)
        most_at_once = max(most_at_once, len(running))
        try:
            await trio.sleep(12)
        finally:
            running.remove(ctx.worker_id)

    driver = StalledClaims({"A": 9.0})
    job_id = await long.enqueue(driver)
    a = worker(driver, registry, lease=LEASE, worker_id="A", claim_ahead=claim_ahead)
    b = worker(driver, registry, lease=LEASE, worker_id="B", claim_ahead=claim_ahead)
    with caplog.at_level(logging.WARNING, logger="jobs_trio"):
        async with trio.open_nursery() as nursery:
            await nursery.start(a.run)
            await trio.sleep(8)  # A's claim is in flight; the job's lease lapses now
            await nursery.start(b.run)
            await trio.sleep(30)
            await a.stop()
            await b.stop()
    assert most_at_once == 1
    # B's claim; A's committed claim's lapse was an orphaning (its attempt handed back): the
    # database cannot tell a stalled claim from a worker that died.
    assert attempts == [1]
    assert (await record(driver, job_id)).orphans == 1
    assert (await record(driver, job_id)).state is JobState.COMPLETED
    late = [r for r in caplog.records if "jobs.claim.late" in r.getMessage()]
    assert len(late) == 1 and job_id in late[0].getMessage()


async def test_a_claim_answered_late_that_no_one_took_meanwhile_is_handed_back_uncounted(
    autojump_clock: object,
) -> None:
    """The claim commits at 0 and is answered at 9, after the 8 s lease, and no other worker
    claimed the job: it is handed back like a drained claim (interrupted, its attempt
    uncounted, ready at once), and the worker's next claim runs it as attempt 1."""
    registry = Registry()
    attempts: list[tuple[int, float]] = []

    @registry.job("quick")
    async def quick(ctx: JobContext, payload: Any) -> None:
        attempts.append((ctx.attempt, trio.current_time()))

    driver = StalledClaims({"A": 9.0})
    job_id = await quick.enqueue(driver)
    a = worker(driver, registry, lease=LEASE, worker_id="A")
    async with trio.open_nursery() as nursery:
        await nursery.start(a.run)
        await trio.sleep(20)
        await a.stop()
    assert attempts == [(1, 9.0)]  # handed back at 9, claimed again at once, not counted twice
    r = await record(driver, job_id)
    assert (r.state, r.attempts) == (JobState.COMPLETED, 1)
    assert a.stats().outcomes[OutcomeKind.INTERRUPTED] == 1


async def test_a_late_claim_of_a_job_this_deploy_does_not_declare_is_handed_back_not_parked(
    autojump_clock: object,
) -> None:
    """Cancelled before it was looked at, a claim of an unknown name is handed back like any
    unstarted claim (a worker that declares it may run it), not parked by this worker for an
    operator to retry. Its next claim, by this worker, parks it as usual."""
    registry = Registry()

    @registry.job("known")
    async def known(ctx: JobContext, payload: Any) -> None:
        return None

    driver = StalledClaims({"A": 9.0})
    [answer] = await driver.enqueue([new_job("unknown")])
    a = worker(driver, registry, lease=LEASE, worker_id="A")
    async with trio.open_nursery() as nursery:
        await nursery.start(a.run)
        await trio.sleep(20)
        await a.stop()
    outcomes = a.stats().outcomes
    assert (outcomes[OutcomeKind.INTERRUPTED], outcomes[OutcomeKind.PARKED]) == (1, 1)
    r = await record(driver, answer.job_id)
    assert (r.state, r.attempts) == (JobState.PARKED, 0)


async def test_a_late_answer_inside_the_lease_is_stopped_at_its_cutoff_from_the_send(
    autojump_clock: object,
) -> None:
    """The worker holds one long run (its renewals succeed until 5.5 s) when a second claim is
    sent at 1 s and answered at 6 s. Its cutoff is 1 + 8 - 2 = 7 s. The watchdog, asleep
    since the 5.33 s renewal round until the 8 s one, must wake for it: at once, for its
    first renewal (due at 1 + 2.67 s; it fails), then at 7 s: at 8 s another worker could
    already hold the job (its lease ran out at 9 s less a renewal it never got, and the
    margin exists so the body has stopped by then)."""
    registry = Registry()
    stopped_at: dict[str, float] = {}
    second_started = trio.Event()

    @registry.job("long")
    async def long(ctx: JobContext, payload: Any) -> None:
        if payload["n"] == 2:
            second_started.set()
        try:
            await trio.sleep_forever()
        finally:
            # First stop only: each job runs again once its lease lapses (lost, not settled).
            stopped_at.setdefault(f"job{payload['n']}", trio.current_time())

    driver = StalledClaims({}, renewals_fail_at=5.5)
    await long.enqueue(driver, {"n": 1})
    w = worker(driver, registry, lease=LEASE, worker_id="W", concurrency=2)
    async with trio.open_nursery() as nursery:
        await nursery.start(w.run)
        await trio.sleep(1)
        driver.stall["W"] = 5.0
        await long.enqueue(driver, {"n": 2})
        await second_started.wait()
        assert trio.current_time() == pytest.approx(6.0)
        await trio.sleep(10)
        await w.stop()
    # Job 1 was last renewed at the 5.33 s round: its cutoff is 5.33 + 6 = 11.33 s.
    assert stopped_at == {
        "job1": pytest.approx(8 / 3 * 2 + 6),
        "job2": pytest.approx(7.0),
    }


class SlowRenewals(StalledClaims):
    """Renewals take effect at once but are answered ``renew_takes`` seconds later (a slow
    database, well inside the lease)."""

    def __init__(self, stall: Mapping[str, float], renew_takes: float) -> None:
        super().__init__(stall)
        self.renew_takes = renew_takes

    async def renew(
        self, leases: Sequence[Lease], *, lease: float, started: Sequence[str] = ()
    ) -> RenewResult:
        result = await super().renew(leases, lease=lease, started=started)
        await trio.sleep(self.renew_takes)
        return result


async def test_a_late_answer_during_a_renewal_does_not_cut_the_renewal_of_the_healthy_runs(
    autojump_clock: object, caplog: pytest.LogCaptureFixture
) -> None:
    """Job 1 is claimed at 0; every renewal commits at once and is answered 1 s later (rounds
    at 2.67, 5.33, 8, ...: each extends its lease long before it runs out). Job 2's claim is
    sent at 0.1 and answered at 5.7, during the 5.33 s round: its cutoff (0.1 + 6 = 6.1 s)
    comes before that round's answer (6.33 s), so job 2 is stopped at 6.1. The round itself
    must not be abandoned for it (job 2 is not even in it): abandoned, job 1's lease stays
    at 2.67 + 8 as the worker sees it, its cutoff 8.67 s, and the 8 s round, answered at 9 s,
    is cut there: job 1 is stopped as lost though every renewal of it succeeded."""
    registry = Registry()
    ended: dict[int, str] = {}

    @registry.job("long")
    async def long(ctx: JobContext, payload: Any) -> None:
        try:
            await trio.sleep(15)
        except trio.Cancelled:
            ended.setdefault(payload["n"], f"stopped at {trio.current_time():.2f}")
            raise
        ended.setdefault(payload["n"], "returned")

    driver = SlowRenewals({}, renew_takes=1.0)
    job1 = await long.enqueue(driver, {"n": 1})
    w = worker(driver, registry, lease=LEASE, worker_id="W", concurrency=2)
    with caplog.at_level(logging.WARNING, logger="jobs_trio"):
        async with trio.open_nursery() as nursery:
            await nursery.start(w.run)
            await trio.sleep(0.1)
            driver.stall["W"] = 5.6
            await long.enqueue(driver, {"n": 2})
            await trio.sleep(20)
            await w.stop()
    assert ended[1] == "returned"
    assert ended[2] == "stopped at 6.10"
    assert (await record(driver, job1)).state is JobState.COMPLETED
    expired = [r.getMessage() for r in caplog.records if "jobs.lease.expired" in r.getMessage()]
    assert not [m for m in expired if job1 in m]


async def test_a_claim_answered_slowly_inside_its_lease_is_renewed_before_its_cutoff(
    autojump_clock: object, caplog: pytest.LogCaptureFixture
) -> None:
    """A claim sent at 0 and answered at 4 (lease 8 from the send, cutoff 6) by a database
    that renews at once: its first renewal is due an interval after the claim was SENT (2.67
    s), not after the answer (6.67 s, past the cutoff). Scheduled from the answer, the run
    is stopped as lost at 6 s though nothing failed, and the job runs a second time."""
    registry = Registry()
    attempts: list[int] = []

    @registry.job("long")
    async def long(ctx: JobContext, payload: Any) -> None:
        attempts.append(ctx.attempt)
        await trio.sleep(10)

    driver = StalledClaims({"W": 4.0})
    job_id = await long.enqueue(driver)
    w = worker(driver, registry, lease=LEASE, worker_id="W")
    with caplog.at_level(logging.WARNING, logger="jobs_trio"):
        async with trio.open_nursery() as nursery:
            await nursery.start(w.run)
            await trio.sleep(30)
            await w.stop()
    assert attempts == [1]
    assert (await record(driver, job_id)).state is JobState.COMPLETED
    assert not [r for r in caplog.records if "jobs.lease.expired" in r.getMessage()]
