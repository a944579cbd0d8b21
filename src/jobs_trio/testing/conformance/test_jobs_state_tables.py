# The per-state tables: for every state a job can be in, what each operation does to it. A
# refused or fenced-off operation leaves the record exactly as it was, every field.
from __future__ import annotations

from collections.abc import Callable

import attrs
import pytest

from jobs_trio._core.errors import InvalidTransition
from jobs_trio._core.operator_transitions import OPERATOR_CANCEL_ERROR
from jobs_trio._core.records import (
    CancelJob,
    Complete,
    DeadLetter,
    JobState,
    Lease,
    Park,
    Retry,
    Settlement,
    StepRecord,
    StepStatus,
    Suspend,
)
from jobs_trio.driver import Driver
from jobs_trio.drivers._rules import LAPSED_ERROR, ORPHANED_ERROR
from jobs_trio.testing._clock import ManualClock

from .helpers import new_job
from .job_states import EVENT, LEASE, RUNNING, STATES, WAIT, Placed, place


async def unchanged(driver: Driver, placed: Placed) -> None:
    assert await driver.get(placed.job_id) == placed.record


# What an operator's cancel does: "cancelled" at once, "flagged" for the worker, or refused.
CANCEL = {
    "ready-due": "cancelled",
    "ready-delayed": "cancelled",
    "ready-retry-delay": "cancelled",
    "running": "flagged",
    "running-cancel-requested": "flagged",
    "suspended-time": "cancelled",
    "suspended-event": "cancelled",
    "parked": "cancelled",
    "completed": "refused",
    "dead": "refused",
    "dead-lapsed-cancel-requested": "refused",
    "cancelled": "refused",
}


@pytest.mark.parametrize("state", STATES)
async def test_operator_cancel(driver: Driver, manual_clock: ManualClock, state: str) -> None:
    placed = await place(driver, manual_clock, state)
    before = placed.record
    if CANCEL[state] == "refused":
        with pytest.raises(InvalidTransition):
            await driver.cancel(placed.job_id)
        await unchanged(driver, placed)
        return
    answer = await driver.cancel(placed.job_id)
    if CANCEL[state] == "cancelled":
        expected = attrs.evolve(
            before,
            state=JobState.CANCELLED,
            last_error=OPERATOR_CANCEL_ERROR,
            updated_at=manual_clock.now,
        )
    else:
        expected = attrs.evolve(before, cancel_requested=True, updated_at=manual_clock.now)
    assert answer == expected
    assert await driver.get(placed.job_id) == expected


RETRYABLE = {"parked", "dead", "dead-lapsed-cancel-requested", "cancelled"}


@pytest.mark.parametrize("state", STATES)
async def test_operator_retry(driver: Driver, manual_clock: ManualClock, state: str) -> None:
    placed = await place(driver, manual_clock, state)
    if state not in RETRYABLE:
        with pytest.raises(InvalidTransition):
            await driver.retry(placed.job_id)
        await unchanged(driver, placed)
        return
    answer = await driver.retry(placed.job_id)
    # Due now, attempts reset, the cancel flag cleared; the last error kept for the operator.
    expected = attrs.evolve(
        placed.record,
        state=JobState.READY,
        run_at=manual_clock.now,
        attempts=0,
        orphans=0,  # forgiven with its attempts
        cancel_requested=False,
        updated_at=manual_clock.now,
    )
    assert answer == expected
    assert await driver.get(placed.job_id) == expected
    [claim] = await driver.claim(["default"], 5, lease=LEASE, worker_id="w2")
    assert claim.job_id == placed.job_id and claim.attempt == 1


LIVE = {s for s in STATES if s not in RETRYABLE | {"completed"}} | {"parked"}


@pytest.mark.parametrize("state", STATES)
async def test_the_unique_key_is_held_in_every_live_state(
    driver: Driver, manual_clock: ManualClock, state: str
) -> None:
    placed = await place(driver, manual_clock, state, key="k")
    [answer] = await driver.enqueue([new_job(key="k")])
    assert answer.created is (state not in LIVE)
    if state in LIVE:
        assert answer.job_id == placed.job_id
    await unchanged(driver, placed)


@pytest.mark.parametrize("holder_state", STATES)
# Not parked: a parked job holds its key itself, so no other job can take it meanwhile.
@pytest.mark.parametrize("retried_state", ["dead", "cancelled"])
async def test_a_hand_retry_is_refused_while_another_live_job_holds_the_key(
    driver: Driver, manual_clock: ManualClock, holder_state: str, retried_state: str
) -> None:
    retried = await place(driver, manual_clock, retried_state, key="k")
    await place(driver, manual_clock, holder_state, key="k")
    if holder_state in LIVE:
        with pytest.raises(InvalidTransition, match="held by another live job"):
            await driver.retry(retried.job_id)
        await unchanged(driver, retried)
    else:
        record = await driver.retry(retried.job_id)
        assert record.state is JobState.READY


@pytest.mark.parametrize("state", STATES)
async def test_stats_count_each_state(
    driver: Driver, manual_clock: ManualClock, state: str
) -> None:
    placed = await place(driver, manual_clock, state)
    [stats] = await driver.stats()
    assert stats.queue == "default"
    assert dict(stats.depth) == {placed.record.state.value: 1}
    due = state == "ready-due"
    assert stats.due == (1 if due else 0)
    assert stats.oldest_ready_age == (manual_clock.now - placed.record.run_at if due else None)
    assert stats.dead == (1 if placed.record.state is JobState.DEAD else 0)


# Claimable at once, and once every delay and lease has run out (a lapsed run is claimed again).
CLAIMABLE_NOW = {"ready-due"}
CLAIMABLE_LATER = {
    "ready-due",
    "ready-delayed",
    "ready-retry-delay",
    "running",
    "running-cancel-requested",
    "suspended-time",
}


@pytest.mark.parametrize("state", STATES)
async def test_claim(driver: Driver, manual_clock: ManualClock, state: str) -> None:
    placed = await place(driver, manual_clock, state)
    claims = await driver.claim(["default"], 5, lease=LEASE, worker_id="w2")
    assert [c.job_id for c in claims] == ([placed.job_id] if state in CLAIMABLE_NOW else [])
    orphaning = state in RUNNING and driver.capabilities.claims_alone
    later = CLAIMABLE_LATER - ({"running-cancel-requested"} if orphaning else set())
    if not claims:
        await unchanged(driver, placed)
        manual_clock.advance(max(WAIT, LEASE) + 1)
        claims = await driver.claim(["default"], 5, lease=LEASE, worker_id="w2")
        assert [c.job_id for c in claims] == ([placed.job_id] if state in later else [])
    before, now = placed.record, manual_clock.now
    if orphaning and placed.record.cancel_requested:
        # Its worker died with the cancel pending: the claim that finds it lapsed ends it
        # cancelled (rules.orphaning), as its settlement would have; its attempt not counted.
        assert await driver.get(placed.job_id) == attrs.evolve(
            before,
            state=JobState.CANCELLED,
            attempts=before.attempts - 1,
            orphans=1,
            lease_until=None,
            worker_id=None,
            cancel_requested=False,
            last_error=OPERATOR_CANCEL_ERROR,
            updated_at=now,
        )
        return
    if not claims:
        await unchanged(driver, placed)
        return
    [claim] = claims
    # A lapsed run is orphaned (its attempt handed back, rules.orphaning) then claimed again,
    # where the driver has the rule; else claimed again with the lapse recorded and counted.
    attempts = before.attempts + (0 if orphaning else 1)
    assert claim.attempt == attempts and claim.lease_until == now + LEASE
    last_error = before.last_error
    if orphaning:
        last_error = ORPHANED_ERROR.format(orphans=1)
    elif state in RUNNING:
        last_error = LAPSED_ERROR
    expected = attrs.evolve(
        before,
        state=JobState.RUNNING,
        attempts=attempts,
        orphans=before.orphans + orphaning,
        lease_until=now + LEASE,
        worker_id="w2",
        wait_event=None,
        last_error=last_error,
        updated_at=now,
    )
    assert await driver.get(placed.job_id) == expected


@pytest.mark.parametrize("state", STATES)
async def test_renew(driver: Driver, manual_clock: ManualClock, state: str) -> None:
    placed = await place(driver, manual_clock, state)
    result = await driver.renew([placed.lease], lease=LEASE)
    if state not in RUNNING:
        assert result.held == frozenset() and result.cancel_requested == frozenset()
        await unchanged(driver, placed)
        return
    assert result.held == {placed.lease.token}
    flagged = state == "running-cancel-requested"
    assert result.cancel_requested == ({placed.lease.token} if flagged else frozenset())
    expected = attrs.evolve(
        placed.record, lease_until=manual_clock.now + LEASE, updated_at=manual_clock.now
    )
    assert await driver.get(placed.job_id) == expected


SETTLEMENTS: dict[str, Callable[[Lease], Settlement]] = {
    "complete": lambda lease: Complete(lease, '"again"'),
    "retry": lambda lease: Retry(lease, 0.0, "again"),
    "interrupted": lambda lease: Retry(lease, 0.0, "again", hands_back=True),
    "dead": lambda lease: DeadLetter(lease, "again"),
    "suspend": lambda lease: Suspend(lease, 0.0, event=EVENT),
    "park": lambda lease: Park(lease, "again"),
    "cancel": lambda lease: CancelJob(lease, "again"),
}


@pytest.mark.parametrize("kind", sorted(SETTLEMENTS))
@pytest.mark.parametrize("state", sorted(set(STATES) - RUNNING))
async def test_a_settlement_of_a_job_not_running_changes_nothing(
    driver: Driver, manual_clock: ManualClock, state: str, kind: str
) -> None:
    # Its last run's lease (or one it never had): the fence refuses it in every resting state.
    placed = await place(driver, manual_clock, state)
    assert await driver.settle([SETTLEMENTS[kind](placed.lease)]) == []
    await unchanged(driver, placed)


@pytest.mark.parametrize("state", STATES)
async def test_save_step(driver: Driver, manual_clock: ManualClock, state: str) -> None:
    placed = await place(driver, manual_clock, state)
    step = StepRecord("s1", StepStatus.DONE, started_at=1.0, finished_at=2.0, result="1")
    saved = await driver.save_step(placed.lease, step)
    assert saved is (state in RUNNING)
    assert list(await driver.load_steps(placed.job_id)) == ([step] if saved else [])
    await unchanged(driver, placed)


@pytest.mark.parametrize("state", STATES)
async def test_send_event(driver: Driver, manual_clock: ManualClock, state: str) -> None:
    placed = await place(driver, manual_clock, state)
    await driver.send_event(EVENT, "{}")
    if state != "suspended-event":
        await unchanged(driver, placed)
        return
    # Ready now; the event it waited on stays named on the record until the next claim.
    expected = attrs.evolve(
        placed.record, state=JobState.READY, run_at=manual_clock.now, updated_at=manual_clock.now
    )
    assert await driver.get(placed.job_id) == expected


@pytest.mark.parametrize("state", STATES)
async def test_get_and_list(driver: Driver, manual_clock: ManualClock, state: str) -> None:
    placed = await place(driver, manual_clock, state)
    assert list(await driver.list_jobs()) == [placed.record]
    assert list(await driver.list_jobs(state=placed.record.state)) == [placed.record]
    others = [s for s in JobState if s is not placed.record.state]
    for other in others:
        assert list(await driver.list_jobs(state=other)) == []
    assert list(await driver.list_jobs(queue="elsewhere")) == []


async def test_stats_answer_one_entry_per_queue_in_name_order(driver: Driver) -> None:
    await driver.enqueue([new_job(queue=q) for q in ("zq", "aq", "mq", "aq")])
    stats = await driver.stats()
    assert [(s.queue, dict(s.depth), s.due) for s in stats] == [
        ("aq", {"ready": 2}, 2),
        ("mq", {"ready": 1}, 1),
        ("zq", {"ready": 1}, 1),
    ]


async def test_a_claim_of_limit_zero_takes_nothing(
    driver: Driver, manual_clock: ManualClock
) -> None:
    placed = await place(driver, manual_clock, "ready-due")
    assert await driver.claim(["default"], 0, lease=LEASE, worker_id="w2") == []
    await unchanged(driver, placed)
