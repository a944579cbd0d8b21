# settle_and_claim (SettlesWithClaims, issue 16), on every driver that has it: the settles and
# the claim as one write — both answered as apart, a settled job never claimed by the same call,
# and a refused settlement leaves nothing written, the claim included.
from __future__ import annotations

from collections.abc import Callable
from typing import cast

import pytest
import trio

from jobs_trio._core.errors import ValueRefused
from jobs_trio._core.records import (
    CancelJob,
    Complete,
    DeadLetter,
    JobRecord,
    JobState,
    Lease,
    Park,
    Retry,
    Settlement,
    Suspend,
)
from jobs_trio.driver import Driver, SettlesWithClaims
from jobs_trio.testing._clock import ManualClock

from .helpers import a_claim_taken_over, claim_one, enqueue_one
from .test_admin_attempt_history import noted
from .test_fleet_limits import limited

# Each kind of settlement as the call carries it, what its job's record then says, and what it
# should say (from the clock at the call): on PostgreSQL each kind is its own statement
# (settle_claim_<kind>, the settle's parameters renumbered after the claim's), so each is tried,
# two settlements at once.
Kind = tuple[
    Callable[[Lease], Settlement], Callable[[JobRecord], object], Callable[[float], object]
]
KINDS: dict[str, Kind] = {
    "complete": (
        lambda lease: Complete(lease, result='{"n": 1}'),
        lambda r: (r.state, r.result, r.attempts),
        lambda now: (JobState.COMPLETED, {"n": 1}, 1),
    ),
    "retry": (
        lambda lease: Retry(lease, delay=60, error="again"),
        lambda r: (r.state, r.last_error, r.attempts, r.run_at),
        lambda now: (JobState.READY, "again", 1, now + 60),
    ),
    "retry-handed-back": (
        lambda lease: Retry(lease, delay=60, error="drained", hands_back=True),
        lambda r: (r.state, r.last_error, r.attempts, r.run_at),
        lambda now: (JobState.READY, "drained", 0, now + 60),
    ),
    "dead": (
        lambda lease: DeadLetter(lease, error="bad"),
        lambda r: (r.state, r.last_error, r.attempts),
        lambda now: (JobState.DEAD, "bad", 1),
    ),
    "suspend": (
        lambda lease: Suspend(lease, delay=60, event="ev"),
        lambda r: (r.state, r.wait_event, r.attempts, r.run_at),
        lambda now: (JobState.SUSPENDED, "ev", 0, now + 60),
    ),
    "park": (
        lambda lease: Park(lease, reason="unknown job name"),
        lambda r: (r.state, r.last_error, r.attempts),
        lambda now: (JobState.PARKED, "unknown job name", 0),
    ),
    "cancel": (
        lambda lease: CancelJob(lease, error="cancelled by its body"),
        lambda r: (r.state, r.last_error, r.attempts),
        lambda now: (JobState.CANCELLED, "cancelled by its body", 1),
    ),
}


def carrying(driver: Driver) -> SettlesWithClaims:
    if not driver.capabilities.settles_with_claims:
        pytest.skip(f"{type(driver).__name__} settles and claims apart (no settle_and_claim)")
    return cast(SettlesWithClaims, driver)


async def test_it_settles_and_claims_as_settle_then_claim_would(driver: Driver) -> None:
    both = carrying(driver)
    first = await enqueue_one(driver, priority=0)
    second = await enqueue_one(driver, priority=1)
    claim = await claim_one(driver)
    applied, claims = await both.settle_and_claim(
        [Complete(claim.lease, result='{"n": 1}')], ["default"], 5, lease=30, worker_id="w2"
    )
    assert list(applied) == [first]
    assert [(c.job_id, c.attempt) for c in claims] == [(second, 1)]
    done, running = await driver.get(first), await driver.get(second)
    assert done is not None and running is not None
    assert (done.state, done.result, done.attempts) == (JobState.COMPLETED, {"n": 1}, 1)
    assert (running.state, running.worker_id) == (JobState.RUNNING, "w2")


async def test_a_stale_settlement_applies_nothing_and_the_claim_still_happens(
    driver: Driver, manual_clock: ManualClock
) -> None:
    both = carrying(driver)
    job = await enqueue_one(driver, priority=0)
    other = await enqueue_one(driver, priority=1)
    old = await claim_one(driver, lease=10)
    manual_clock.advance(11)
    # The lease lapsed: another worker holds the job now.
    [again] = await driver.claim(["default"], 1, lease=30, worker_id="w2")
    assert again.job_id == job
    applied, claims = await both.settle_and_claim(
        [Complete(old.lease)], ["default"], 5, lease=30, worker_id="w1"
    )
    assert list(applied) == []  # fenced
    assert [c.job_id for c in claims] == [other]
    held = await driver.get(job)
    assert held is not None and (held.state, held.worker_id) == (JobState.RUNNING, "w2")


async def test_a_lapsed_lease_settled_by_the_call_is_not_also_claimed_by_it(
    driver: Driver, manual_clock: ManualClock
) -> None:
    # Its token is still current, so the settle applies; its lease has lapsed, so apart from
    # the settle it would be a claim's candidate. One write must not do both to one job.
    both = carrying(driver)
    job = await enqueue_one(driver)
    claim = await claim_one(driver, lease=10)
    manual_clock.advance(11)
    applied, claims = await both.settle_and_claim(
        [Complete(claim.lease)], ["default"], 5, lease=30, worker_id="w1"
    )
    assert list(applied) == [job] and list(claims) == []
    record = await driver.get(job)
    assert record is not None and (record.state, record.attempts) == (JobState.COMPLETED, 1)


async def test_mixed_kinds_settle_and_claim_together(driver: Driver) -> None:
    both = carrying(driver)
    ids = {await enqueue_one(driver) for _ in range(3)}
    a, b = await driver.claim(["default"], 2, lease=30, worker_id="w1")
    applied, claims = await both.settle_and_claim(
        [Complete(a.lease), Retry(b.lease, delay=60, error="again")],
        ["default"],
        5,
        lease=30,
        worker_id="w1",
    )
    assert sorted(applied) == sorted([a.job_id, b.job_id])
    assert [c.job_id for c in claims] == list(ids - {a.job_id, b.job_id})
    done, retried = await driver.get(a.job_id), await driver.get(b.job_id)
    assert done is not None and done.state is JobState.COMPLETED
    assert retried is not None and (retried.state, retried.last_error) == (JobState.READY, "again")


async def test_a_refused_settlement_writes_nothing_not_even_the_claim(driver: Driver) -> None:
    both = carrying(driver)
    job = await enqueue_one(driver, priority=0)
    waiting = await enqueue_one(driver, priority=1)
    claim = await claim_one(driver)
    # A NUL (PostgreSQL refuses it) and a lone surrogate (SQLite cannot encode it).
    with pytest.raises(ValueRefused):
        await both.settle_and_claim(
            [Complete(claim.lease, result='"\x00\ud800"')],
            ["default"],
            5,
            lease=30,
            worker_id="w1",
        )
    held, untouched = await driver.get(job), await driver.get(waiting)
    assert held is not None and (held.state, held.worker_id) == (JobState.RUNNING, "w1")
    assert untouched is not None and (untouched.state, untouched.attempts) == (JobState.READY, 0)
    # Nothing was lost: the same lease still settles once the value is one it can store.
    assert list(await driver.settle([Complete(claim.lease, result='"ok"')])) == [job]


@pytest.mark.parametrize("kind", sorted(KINDS))
async def test_every_kind_settles_and_claims_in_one_call(
    driver: Driver, manual_clock: ManualClock, kind: str
) -> None:
    # Two runs of the kind whose leases lapsed (still theirs: the settles apply, and neither
    # is the claim's candidate), a waiting job the claim takes.
    both = carrying(driver)
    a, b = await enqueue_one(driver, priority=0), await enqueue_one(driver, priority=0)
    waiting = await enqueue_one(driver, priority=1)
    claims = await driver.claim(["default"], 2, lease=10, worker_id="w1")
    assert {c.job_id for c in claims} == {a, b}
    manual_clock.advance(11)
    make, seen, expected = KINDS[kind]
    applied, claimed = await both.settle_and_claim(
        [make(c.lease) for c in claims], ["default"], 5, lease=30, worker_id="w2"
    )
    assert sorted(applied) == sorted([a, b])
    assert [(c.job_id, c.attempt) for c in claimed] == [(waiting, 1)]
    for job in (a, b):
        record = await driver.get(job)
        assert record is not None
        assert seen(record) == expected(manual_clock.now)
        assert (record.lease_until, record.worker_id) == (None, None)
    taken = await driver.get(waiting)
    assert taken is not None and (taken.state, taken.worker_id) == (JobState.RUNNING, "w2")


@pytest.mark.parametrize("kind", ["retry", "suspend", "park"])
async def test_an_operators_pending_cancel_wins_over_a_carried_settlement(
    driver: Driver, kind: str
) -> None:
    both = carrying(driver)
    job = await enqueue_one(driver, priority=0)
    waiting = await enqueue_one(driver, priority=1)
    claim = await claim_one(driver)
    await driver.cancel(job)  # running: flagged, for the run's next renewal
    make, _, _ = KINDS[kind]
    applied, claimed = await both.settle_and_claim(
        [make(claim.lease)], ["default"], 5, lease=30, worker_id="w1"
    )
    assert list(applied) == [job]
    assert [c.job_id for c in claimed] == [waiting]
    record = await driver.get(job)
    assert record is not None
    assert (record.state, record.attempts, record.cancel_requested) == (
        JobState.CANCELLED,
        1,
        False,
    )


async def test_a_slot_the_settle_frees_goes_to_its_waiter_in_the_same_call(
    driver: Driver, manual_clock: ManualClock
) -> None:
    # As settle() then claim() would: the settled run's fleet slot is free for the claim, and
    # the job a full slot put off is taken by it (not left for a later wake-up).
    both = carrying(driver)
    holder, waiter = [a.job_id for a in await driver.enqueue([limited(1), limited(1, priority=1)])]
    [claim] = await driver.claim(["default"], 10, lease=30, worker_id="w1")
    assert claim.job_id == holder
    manual_clock.advance(1)
    applied, claimed = await both.settle_and_claim(
        [Complete(claim.lease)], ["default"], 10, lease=30, worker_id="w1"
    )
    assert list(applied) == [holder]
    assert [(c.job_id, c.attempt) for c in claimed] == [(waiter, 1)]


async def test_slots_a_batch_of_completions_frees_go_to_their_waiters_in_the_same_call(
    driver: Driver, manual_clock: ManualClock
) -> None:
    # The same with several completions at once, which a driver may write together (SQLite
    # frees their slots in the claim's own look: one statement fewer).
    both = carrying(driver)
    ids = [a.job_id for a in await driver.enqueue([limited(2, priority=n) for n in range(4)])]
    claims = await driver.claim(["default"], 10, lease=30, worker_id="w1")
    assert [c.job_id for c in claims] == ids[:2]  # the slots are full: two wait
    manual_clock.advance(1)
    applied, claimed = await both.settle_and_claim(
        [Complete(c.lease, result="null") for c in claims],
        ["default"],
        10,
        lease=30,
        worker_id="w1",
    )
    assert list(applied) == ids[:2]
    assert [(c.job_id, c.attempt) for c in claimed] == [(ids[2], 1), (ids[3], 1)]


@pytest.mark.parametrize("limit", [0, {"default": 0}])
async def test_slots_freed_by_completions_carried_on_a_claim_for_nothing(
    driver: Driver, limit: int | dict[str, int]
) -> None:
    # A claim that asks for nothing (its queues' slots all taken) still frees the fleet slots of
    # the completions it carries: SQLite left them to the claim's look, which a claim for
    # nothing does not run, and the waiter was put off until the slots' leases ran out.
    both = carrying(driver)
    ids = [a.job_id for a in await driver.enqueue([limited(2, priority=n) for n in range(3)])]
    claims = await driver.claim(["default"], 10, lease=30, worker_id="w1")
    assert [c.job_id for c in claims] == ids[:2]  # the slots are full: the third waits
    applied, claimed = await both.settle_and_claim(
        [Complete(c.lease, result="null") for c in claims],
        ["default"],
        limit,
        lease=30,
        worker_id="w1",
    )
    assert (list(applied), list(claimed)) == (ids[:2], [])
    again = await driver.claim(["default"], 10, lease=30, worker_id="w1")
    assert [c.job_id for c in again] == [ids[2]]


async def test_a_stale_completion_among_others_is_fenced_and_the_rest_apply(
    driver: Driver, manual_clock: ManualClock
) -> None:
    both = carrying(driver)
    job, old, again = await a_claim_taken_over(driver, manual_clock)
    fresh = await enqueue_one(driver, priority=1)
    other = await enqueue_one(driver, priority=2)
    current = await claim_one(driver)
    assert current.job_id == fresh
    applied, claims = await both.settle_and_claim(
        [noted(Complete(old.lease, result="1"), 1), noted(Complete(current.lease, result="2"), 1)],
        ["default"],
        5,
        lease=30,
        worker_id="w1",
    )
    assert list(applied) == [fresh]
    assert [c.job_id for c in claims] == [other]
    held, done = await driver.get(job), await driver.get(fresh)
    assert held is not None and (held.state, held.attempts) == (JobState.RUNNING, again.attempt)
    assert done is not None and (done.state, done.result) == (JobState.COMPLETED, 2)
    # The stale one recorded no ending (its lapse did: the takeover's orphaning).
    assert "completed" not in [a.outcome for a in await driver.load_attempts(job)]
    [ending] = await driver.load_attempts(fresh)
    assert (ending.seq, ending.outcome, ending.seconds) == (1, "completed", 1.5)


async def test_a_refused_carried_lone_surrogate_is_a_value_refusal(driver: Driver) -> None:
    # ValueRefused, not a plain DriverError: the worker gives a refused batch back to be
    # isolated, and retries a failed one as it is (a plain error here would fail every claim).
    both = carrying(driver)
    await enqueue_one(driver, priority=0)
    claim = await claim_one(driver)
    with pytest.raises(ValueRefused):
        await both.settle_and_claim(
            [Complete(claim.lease, result='"\ud800"')], ["default"], 5, lease=30, worker_id="w1"
        )


@pytest.mark.parametrize("kind", ["retry", "suspend"])
async def test_a_job_the_settle_makes_due_now_is_claimed_by_the_same_call(
    driver: Driver, kind: str
) -> None:
    # A retry or suspension without delay is ready at once: settle() then claim() would take it
    # again, so the one call does too (not left for a wake-up the claim loop must wait for).
    both = carrying(driver)
    job = await enqueue_one(driver)
    claim = await claim_one(driver)
    now = (
        Retry(claim.lease, delay=0, error="again")
        if kind == "retry"
        else Suspend(claim.lease, delay=0)
    )
    applied, claimed = await both.settle_and_claim([now], ["default"], 5, lease=30, worker_id="w1")
    assert list(applied) == [job]
    # A retry counts its attempt; a suspension hands it back.
    assert [(c.job_id, c.attempt) for c in claimed] == [(job, 2 if kind == "retry" else 1)]


async def test_a_claim_without_rescue_takes_and_buries_no_lapsed_job(
    driver: Driver, manual_clock: ManualClock
) -> None:
    # Just back from an outage, a worker leaves lapsed jobs to their runners for a while
    # (outage.py): rescue=False takes none, hands none back, buries none, and still takes what
    # is due.
    lapsed = await enqueue_one(driver, attempts=1)
    await claim_one(driver, lease=5)
    manual_clock.advance(6)
    due = await enqueue_one(driver)
    claims = await driver.claim(["default"], 5, lease=5, worker_id="w2", rescue=False)
    assert [c.job_id for c in claims] == [due]
    record = await driver.get(lapsed)
    assert record is not None and record.state is JobState.RUNNING  # neither taken nor buried
    rescued = await driver.claim(["default"], 5, lease=5, worker_id="w2")
    record = await driver.get(lapsed)
    assert record is not None
    if driver.capabilities.claims_alone:
        # Handed back orphaned by the claim that may rescue, and taken: not charged.
        assert [(c.job_id, c.attempt) for c in rescued] == [(lapsed, 1)]
        assert record.state is JobState.RUNNING and record.orphans == 1
    else:
        assert rescued == []  # out of attempts: buried now, at the claim that may rescue
        assert record.state is JobState.DEAD


async def test_a_carried_claim_without_rescue_takes_no_lapsed_job(
    driver: Driver, manual_clock: ManualClock
) -> None:
    both = carrying(driver)
    lapsed = await enqueue_one(driver, priority=0)
    await claim_one(driver, lease=5)
    settled = await enqueue_one(driver, priority=1)
    claim = await claim_one(driver, lease=60)
    manual_clock.advance(6)
    due = await enqueue_one(driver, priority=2)
    applied, claims = await both.settle_and_claim(
        [Complete(claim.lease, result="1")], ["default"], 5, lease=5, worker_id="w2", rescue=False
    )
    assert list(applied) == [settled]
    assert [c.job_id for c in claims] == [due]
    record = await driver.get(lapsed)
    assert record is not None and record.state is JobState.RUNNING


async def test_a_wait_that_rescues_later_is_not_woken_by_a_lapsed_lease(
    driver: Driver, manual_clock: ManualClock
) -> None:
    # A worker back from an outage takes no lapsed job for a while: its wait for work must not
    # count one as due (else it answers at once, every time, to a claim that may not take it).
    if not driver.capabilities.rescue_on_request:
        pytest.skip(f"{type(driver).__name__} takes every lapsed job it finds")
    with trio.move_on_after(0.2) as idle:  # nothing at all: no lease counts as work either
        await driver.wait_for_work(["default"], timeout=30, rescue_from=manual_clock.now + 60)
    assert idle.cancelled_caught
    await enqueue_one(driver)
    await claim_one(driver, lease=5)
    manual_clock.advance(6)
    with trio.move_on_after(0.2) as waited:
        await driver.wait_for_work(["default"], timeout=30, rescue_from=manual_clock.now + 60)
    assert waited.cancelled_caught
    with trio.fail_after(5):
        await driver.wait_for_work(["default"], timeout=30)  # lapsed, and rescued now: at once
