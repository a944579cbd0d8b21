# Every field of a job and of a claim read back after each write: enqueue (one and a batch),
# claim, renew, each settlement, a re-claim after a lapse. Distinct values in every column, and
# each answer compared whole, so a swapped or forgotten column fails.
from __future__ import annotations

import json
from collections.abc import Callable

import attrs
import pytest

from jobs_trio._core.records import (
    CancelJob,
    Claim,
    Complete,
    DeadLetter,
    JobRecord,
    JobState,
    Lease,
    NewJob,
    Park,
    Retry,
    Settlement,
    Suspend,
)
from jobs_trio.driver import Driver
from jobs_trio.drivers._rules import ORPHANED_ERROR
from jobs_trio.testing._clock import ManualClock

from .helpers import new_job


def written(job: NewJob, now: float) -> JobRecord:
    """The record an enqueue at ``now`` must store for ``job``."""
    return JobRecord(
        id=job.job_id,
        name=job.name,
        queue=job.queue,
        state=JobState.READY,
        payload=job.payload,
        priority=job.priority,
        attempts=0,
        max_attempts=job.max_attempts,
        run_at=now + job.delay,
        created_at=now,
        updated_at=now,
        key=job.key,
    )


async def read(driver: Driver, job_id: str) -> JobRecord:
    record = await driver.get(job_id)
    assert record is not None
    return record


async def test_enqueue_one_stores_every_field(driver: Driver, manual_clock: ManualClock) -> None:
    job = new_job("n.one", queue="q1", payload={"a": 1}, attempts=4, priority=7, delay=5, key="k")
    [answer] = await driver.enqueue([job])
    assert answer.job_id == job.job_id and answer.created
    assert await read(driver, job.job_id) == written(job, manual_clock.now)


async def test_enqueue_a_batch_stores_each_job_as_its_own(
    driver: Driver, manual_clock: ManualClock
) -> None:
    jobs = [
        new_job("n.a", queue="q1", payload=[1], attempts=2, priority=3, delay=0, key="ka"),
        new_job("n.b", queue="q2", payload="x", attempts=9, priority=-1, delay=12.5),
        new_job("n.c", queue="q1", payload=None, attempts=1, priority=0, delay=3, key="kc"),
    ]
    answers = await driver.enqueue(jobs)
    assert [(a.job_id, a.created) for a in answers] == [(j.job_id, True) for j in jobs]
    for job in jobs:
        assert await read(driver, job.job_id) == written(job, manual_clock.now)


async def test_claim_answers_every_field_and_writes_the_run(
    driver: Driver, manual_clock: ManualClock
) -> None:
    job = new_job("n.claim", queue="q1", payload={"b": 2}, attempts=4, priority=7, key="k")
    await driver.enqueue([job])
    before = await read(driver, job.job_id)
    manual_clock.advance(2)
    now = manual_clock.now
    [claim] = await driver.claim(["q1"], 1, lease=30, worker_id="w-7")
    assert claim == Claim(
        job_id=job.job_id,
        token=claim.token,
        name="n.claim",
        queue="q1",
        payload=job.payload,
        attempt=1,
        max_attempts=4,
        lease_until=now + 30,
        due_at=before.run_at,  # when it became due: the wait to its start is measured from it
    )
    assert isinstance(claim.token, str) and len(claim.token) >= 16
    assert await read(driver, job.job_id) == attrs.evolve(
        before,
        state=JobState.RUNNING,
        attempts=1,
        lease_until=now + 30,
        worker_id="w-7",
        updated_at=now,
    )


async def test_renew_moves_only_the_lease_and_the_update_time(
    driver: Driver, manual_clock: ManualClock
) -> None:
    job = new_job(queue="q1", attempts=4)
    await driver.enqueue([job])
    [claim] = await driver.claim(["q1"], 1, lease=30, worker_id="w-7")
    before = await read(driver, job.job_id)
    manual_clock.advance(10)
    result = await driver.renew([claim.lease], lease=45)
    assert result.held == {claim.token} and result.cancel_requested == frozenset()
    assert await read(driver, job.job_id) == attrs.evolve(
        before, lease_until=manual_clock.now + 45, updated_at=manual_clock.now
    )


def settled(before: JobRecord, s: Settlement, now: float) -> JobRecord:
    """The record each kind of settlement must leave, from the running ``before``."""
    ended = attrs.evolve(before, lease_until=None, worker_id=None, updated_at=now)
    match s:
        case Complete(result=result):
            # A record holds the value the stored JSON stands for.
            value = None if result is None else json.loads(result)
            return attrs.evolve(ended, state=JobState.COMPLETED, result=value)
        case Retry(delay=delay, error=error, hands_back=hands_back):
            # Interrupted (handed back at once): its run_at, so its place in line, stays.
            keeps_place = hands_back and delay <= 0
            return attrs.evolve(
                ended,
                state=JobState.READY,
                run_at=before.run_at if keeps_place else now + delay,
                attempts=before.attempts - (1 if hands_back else 0),
                last_error=error,
            )
        case DeadLetter(error=error):
            return attrs.evolve(ended, state=JobState.DEAD, last_error=error)
        case Suspend(delay=delay, event=event):
            return attrs.evolve(
                ended,
                state=JobState.SUSPENDED,
                run_at=now + delay,
                attempts=before.attempts - 1,
                wait_event=event,
            )
        case Park(reason=reason):
            return attrs.evolve(
                ended, state=JobState.PARKED, attempts=before.attempts - 1, last_error=reason
            )
        case CancelJob(error=error):
            return attrs.evolve(ended, state=JobState.CANCELLED, last_error=error)
    raise AssertionError(s)


ENDINGS: dict[str, Callable[[Lease], Settlement]] = {
    "complete": lambda lease: Complete(lease, '{"r": 1}'),
    "complete-without-result": lambda lease: Complete(lease),
    "retry": lambda lease: Retry(lease, 17.5, "boom"),
    "interrupted": lambda lease: Retry(lease, 0.0, "drained", hands_back=True),
    "dead": lambda lease: DeadLetter(lease, "fatal"),
    "suspend-time": lambda lease: Suspend(lease, 40.0),
    "suspend-event": lambda lease: Suspend(lease, 900.0, event="paid"),
    "park": lambda lease: Park(lease, "unknown name"),
    "cancel": lambda lease: CancelJob(lease, "stopped"),
}


@pytest.mark.parametrize("kind", sorted(ENDINGS))
async def test_each_settlement_writes_exactly_its_fields(
    driver: Driver, manual_clock: ManualClock, kind: str
) -> None:
    job = new_job(queue="q1", attempts=4, priority=2, key="k")
    await driver.enqueue([job])
    manual_clock.advance(1)
    [claim] = await driver.claim(["q1"], 1, lease=30, worker_id="w-7")
    before = await read(driver, job.job_id)
    manual_clock.advance(3)
    settlement = ENDINGS[kind](claim.lease)
    assert await driver.settle([settlement]) == [job.job_id]
    assert await read(driver, job.job_id) == settled(before, settlement, manual_clock.now)


async def test_every_kind_in_one_batch_with_a_stale_token_and_an_unknown_id(
    driver: Driver, manual_clock: ManualClock
) -> None:
    jobs = [new_job(queue="q1", attempts=4) for _ in ENDINGS]
    stale_job = new_job(queue="q2", attempts=4)
    await driver.enqueue([*jobs, stale_job])
    claims = {c.job_id: c for c in await driver.claim(["q1"], 20, lease=30, worker_id="w")}
    [old] = await driver.claim(["q2"], 1, lease=10, worker_id="w")
    manual_clock.advance(11)
    [current] = await driver.claim(["q2"], 1, lease=30, worker_id="w2")  # took over the lapse
    befores = {j.job_id: await read(driver, j.job_id) for j in [*jobs, stale_job]}
    manual_clock.advance(1)
    batch = [make(claims[j.job_id].lease) for j, make in zip(jobs, ENDINGS.values(), strict=True)]
    unknown = Complete(attrs.evolve(old.lease, job_id="no-such-job"))
    stale = Retry(old.lease, 0.0, "late")
    # Mixed in, not at the ends: the answer keeps the batch's order and skips the refused ones.
    mixed = [*batch[:3], stale, *batch[3:6], unknown, *batch[6:]]
    assert await driver.settle(mixed) == [j.job_id for j in jobs]
    for job, settlement in zip(jobs, batch, strict=True):
        expected = settled(befores[job.job_id], settlement, manual_clock.now)
        assert await read(driver, job.job_id) == expected
    assert await read(driver, stale_job.job_id) == befores[stale_job.job_id]
    # The stale settlement did not touch the current run: its lease is still held.
    assert (await driver.renew([current.lease], lease=30)).held == {current.token}


async def test_a_reclaim_after_a_lapse_records_the_lapse(
    driver: Driver, manual_clock: ManualClock
) -> None:
    job = new_job(queue="q1", attempts=2)
    await driver.enqueue([job])
    [first] = await driver.claim(["q1"], 1, lease=10, worker_id="w-1")
    before = await read(driver, job.job_id)
    manual_clock.advance(11)
    now = manual_clock.now
    claims = await driver.claim(["q1"], 1, lease=30, worker_id="w-2")
    # Handed back orphaned (its attempt not counted); PostgreSQL's claim takes it from its next
    # claim on (Driver.claim).
    [second] = claims or await driver.claim(["q1"], 1, lease=30, worker_id="w-2")
    assert second.attempt == 1 and second.token != first.token
    assert second.lease_until == now + 30 and second.max_attempts == 2
    assert await read(driver, job.job_id) == attrs.evolve(
        before,
        attempts=1,
        orphans=1,
        lease_until=now + 30,
        worker_id="w-2",
        last_error=ORPHANED_ERROR.format(orphans=1),
        updated_at=now,
    )


async def test_claim_order_ties_break_by_id_and_list_order_is_the_reverse(
    driver: Driver, manual_clock: ManualClock
) -> None:
    # One batch: equal priority, run time and created time, so the id decides — ascending for
    # claims (ids are time then random bits: roughly oldest first), descending for list_jobs.
    ids = ["0190a", "0190c", "0190b", "01909"]
    jobs = [attrs.evolve(new_job(), job_id=i) for i in ids]
    await driver.enqueue(jobs)
    listed = [r.id for r in await driver.list_jobs()]
    assert listed == sorted(ids, reverse=True)
    claimed = [c.job_id for c in await driver.claim(["default"], 10, lease=30, worker_id="w")]
    assert claimed == sorted(ids)


async def test_list_jobs_is_newest_first_across_batches_then_by_id(
    driver: Driver, manual_clock: ManualClock
) -> None:
    early = [attrs.evolve(new_job(), job_id=i) for i in ("0190z", "0190y")]
    late = [attrs.evolve(new_job(), job_id=i) for i in ("01900", "01901")]
    await driver.enqueue(early)
    manual_clock.advance(1)
    await driver.enqueue(late)
    assert [r.id for r in await driver.list_jobs()] == ["01901", "01900", "0190z", "0190y"]
    assert [r.id for r in await driver.list_jobs(limit=3)] == ["01901", "01900", "0190z"]


async def test_a_queue_named_twice_is_claimed_once(driver: Driver) -> None:
    jobs = [new_job(queue="q1") for _ in range(3)]
    await driver.enqueue(jobs)
    claims = await driver.claim(["q1", "q1"], 10, lease=30, worker_id="w")
    assert sorted(c.job_id for c in claims) == sorted(j.job_id for j in jobs)
    assert len({c.token for c in claims}) == 3


async def test_the_answer_follows_the_batch_order_of_the_settlements_applied(
    driver: Driver, manual_clock: ManualClock
) -> None:
    # A stale settlement of a job ahead of its current one: the job's place in the answer is
    # the current settlement's, as if the batch were applied one at a time.
    a, b = new_job(queue="q1", attempts=4), new_job(queue="q2", attempts=4)
    await driver.enqueue([a, b])
    [old_a] = await driver.claim(["q1"], 1, lease=10, worker_id="w")
    manual_clock.advance(11)
    [new_a] = await driver.claim(["q1"], 1, lease=30, worker_id="w2")
    [claim_b] = await driver.claim(["q2"], 1, lease=30, worker_id="w2")
    answer = await driver.settle(
        [Complete(old_a.lease), Complete(claim_b.lease), Complete(new_a.lease)]
    )
    assert answer == [b.job_id, a.job_id]


@pytest.mark.parametrize(
    "stored",
    ["NaN", '{"n": -Infinity}', "1e400", "not json"],
    # Ids without spaces or quotes: a test id is typed on a command line (-k, a node id).
    ids=["nan", "infinity-inside", "past-float", "not-json"],
)
async def test_a_result_json_cannot_carry_is_read_back_as_stored(
    driver: Driver, stored: str
) -> None:
    # jobs_trio's own encoder never writes these; a row written outside it may. As floats they
    # printed as NaN / Infinity in `--json`, which no strict JSON reader takes.
    job = new_job()
    await driver.enqueue([job])
    [claim] = await driver.claim(["default"], 1, lease=30, worker_id="w")
    assert await driver.settle([Complete(claim.lease, stored)]) == [job.job_id]
    record = await read(driver, job.job_id)
    assert record.result == stored
